"""Plain functions of a module no test worker process allows (not --flows, not --allow-import)."""

from __future__ import annotations


def double(x: int) -> int:
    return 2 * x
