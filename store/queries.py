"""Named SQL blocks from ``store/sql/*.sql``, loaded once at import.

A block starts with ``-- name: NAME``; comment lines right after it document the
query. Queries are addressed as ``"file.NAME"`` (e.g. ``"runs.claim"``).

What is sent is the block compacted (``compact``): its documentation's first line, then
the statement without comments, indentation or blank lines. The first line names the
statement where operators read it (``pg_stat_activity``, ``pg_stat_statements``, the
server's log); the rest of the documentation stays in the file. The size counts on the
client: psycopg caches the conversion of a query's ``%(name)s`` placeholders only for a
text of at most 4 KB and converts a longer one again at every call. The claim by
snapshot, ``runs.claim_and_activate``, is 3,531 bytes as written and 2,239 compacted
(``len(written()["runs.claim_and_activate"])`` and ``len(q("runs.claim_and_activate"))``).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*([a-z_]+)\s*$", re.MULTILINE)

_TOKEN = re.compile(
    r"""(?P<literal>'(?:[^']|'')*'               # a string ('' is a quote inside it)
       | "(?:[^"]|"")*"                          # a quoted identifier
       | \$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$)  # a dollar-quoted body: kept as written
      | (?P<comment>--[^\n]*)                    # a line comment
    """,
    re.DOTALL | re.VERBOSE,
)
_LAYOUT = re.compile(r"[ \t]*\n\s*")
"""Whitespace around line breaks: indentation, trailing blanks, empty lines."""


def compact(body: str) -> str:
    """The statement as sent: the leading comment's first line, then the SQL with its
    comments and layout removed. Literals, quoted identifiers and dollar-quoted bodies
    are kept byte for byte (a ``--`` inside one is not a comment)."""
    body = body.strip()
    out: list[str] = []
    code: list[str] = []  # the text since the last kept token: comments dropped from it

    def flush() -> None:
        out.append(_LAYOUT.sub("\n", "".join(code)))
        code.clear()

    pos = 0
    for match in _TOKEN.finditer(body):
        code.append(body[pos : match.start()])
        pos = match.end()
        if match.group("literal") is not None:
            flush()
            out.append(match.group("literal"))
        elif match.start() == 0:  # the documentation's first line names the statement
            out.append(match.group("comment"))
    code.append(body[pos:])
    flush()
    return "".join(out).strip()


def _parse(text: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    parts = _HEADER.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise RuntimeError(f"duplicate SQL block {name!r}")
        blocks[name] = body.strip()
    return blocks


def written() -> dict[str, str]:
    """Every named block as its file has it, documentation included, by ``file.NAME``."""
    queries: dict[str, str] = {}
    for entry in resources.files("runfleet.store.sql").iterdir():
        if entry.name.endswith(".sql"):
            prefix = entry.name.removesuffix(".sql")
            for name, body in _parse(entry.read_text()).items():
                queries[f"{prefix}.{name}"] = body
    return queries


@cache
def _all() -> dict[str, str]:
    return {name: compact(body) for name, body in written().items()}


def q(name: str) -> str:
    """The SQL text of a named query; a typo fails loudly at first use."""
    try:
        return _all()[name]
    except KeyError:
        raise KeyError(f"no SQL block named {name!r}") from None
