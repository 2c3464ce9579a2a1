"""Named SQL blocks from ``store/sql/*.sql``, loaded once at import.

A block starts with ``-- name: NAME``; comment lines right after it document the
query. Queries are addressed as ``"file.NAME"`` (e.g. ``"runs.claim"``).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*([a-z_]+)\s*$", re.MULTILINE)


def _parse(text: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    parts = _HEADER.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise RuntimeError(f"duplicate SQL block {name!r}")
        blocks[name] = body.strip()
    return blocks


@cache
def _all() -> dict[str, str]:
    queries: dict[str, str] = {}
    for entry in resources.files("runfleet.store.sql").iterdir():
        if entry.name.endswith(".sql"):
            prefix = entry.name.removesuffix(".sql")
            for name, body in _parse(entry.read_text()).items():
                queries[f"{prefix}.{name}"] = body
    return queries


def q(name: str) -> str:
    """The SQL text of a named query; a typo fails loudly at first use."""
    try:
        return _all()[name]
    except KeyError:
        raise KeyError(f"no SQL block named {name!r}") from None
