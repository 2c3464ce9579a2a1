"""Plain functions of a module a test worker process allows by ``--allow-import``."""

from __future__ import annotations


def triple(x: int) -> int:
    return 3 * x
