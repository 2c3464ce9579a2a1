"""Text on the operator's terminal: what was stored is printed literally, never acted on.

Run ids, flow names, error messages, notes, reasons, answers, results and liveness keys
are written by flow bodies, producers and Redis clients the operator does not control,
and a terminal acts on some characters: ESC opens ANSI and OSC sequences (clear the
screen, retitle the window, forge a hyperlink, write the clipboard), a C1 control does
the same in one character, CR rewinds the line, a newline starts a new one (a forged
"next: …" under ``explain``'s own), bidi overrides reorder what follows. So everything
the CLI prints is built here: stored text goes through ``literal`` and reaches rich as
``Text``, which rich never parses as markup (``[red]``) or emoji codes (``:warning:``).

``literal`` is Python's ``repr`` without the quotes: every character ``str.isprintable``
refuses (Unicode's "Other" and "Separator" categories except the space: C0, DEL, C1,
format characters such as bidi overrides and zero-width spaces, line separators,
surrogates, unassigned code points) is shown as ``\\n``, ``\\r``, ``\\t``, ``\\xNN``,
``\\uNNNN`` or ``\\UNNNNNNNN``. Every other character is kept, backslashes too, so an
ordinary id prints as typed and can be pasted back, and ``literal`` of its own output
is that output unchanged (the explanation's lines are escaped where they are built and
again where they are printed).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text
from rich.tree import Tree

out = Console(highlight=False, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)

Part = str | Text
"""A piece of a printed line: text (escaped with ``literal``) or ``styled`` text."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def literal(text: str) -> str:
    """``text`` with every character a terminal could act on shown as its escape."""
    if text.isprintable():
        return text  # the common case, checked in C
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def block(text: str) -> Text:
    """A multi-line text the code laid out (indented JSON, SQL): each line ``literal``."""
    return Text("\n".join(literal(line) for line in text.split("\n")))


def json_text(text: str) -> str:
    """JSON for a terminal: the same value, with no character a terminal acts on.

    The JSON encoder escapes C0 controls inside strings; DEL, C1, bidi and the other
    non-printables it leaves raw can only sit inside strings (JSON's own syntax is
    ASCII), where ``\\uXXXX`` (a surrogate pair past the BMP) spells the same string.
    """
    if text.isascii() and "\x7f" not in text:
        return text
    return "".join(_json_escape(ch) if not ch.isprintable() and ch != "\n" else ch for ch in text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def styled(text: str, style: str) -> Text:
    """``text``, escaped, in a rich style (``red``, ``dim``, ``bold``)."""
    return Text(literal(text), style=style)


def line(*parts: Part) -> Text:
    """One printed line: text parts escaped, styled parts as they are."""
    return Text.assemble(*(p if isinstance(p, Text) else literal(p) for p in parts))


def say(*parts: Part, stream: Console = out) -> None:
    """Print one line (a long one wraps on the screen, not in the text)."""
    stream.print(line(*parts), soft_wrap=True)


def add_row(table: Table, *cells: Part) -> None:
    """A table row, each cell a part (escaped text, or ``styled``/``block`` text)."""
    table.add_row(*(line(cell) for cell in cells))


def table(*headers: str, ids: tuple[str, ...] = ()) -> Table:
    """A listing whose cells are never cut: on a narrow terminal a long cell folds onto
    more lines, and an ``ids`` column is never folded either (an id is pasted whole into
    ``explain`` or a script; ``show`` widens it to its longest id)."""
    return Table(*(Column(h, overflow="fold", no_wrap=h in ids) for h in headers), box=None)


WIDE = 1_000_000
"""The width a listing is laid out in when it is not for a terminal (piped, ``--wide``)."""


def tree(*label: Part) -> Tree:
    return Tree(line(*label))


def branch(parent: Tree, *label: Part) -> Tree:
    return parent.add(line(*label))


def show(renderable: Table | Tree, *, wide: bool = False) -> None:
    """Print a table or tree built with ``add_row`` / ``tree`` / ``branch``.

    Laid out for the terminal's width only on a terminal and without ``wide``: piped
    (``| cat``, ``| grep``) or with ``--wide``, every row is one whole line."""
    if isinstance(renderable, Table):
        for column in renderable.columns:
            if column.no_wrap:  # an id column: as wide as its longest id
                widest = 0
                for cell in column.cells:
                    if isinstance(cell, Text):
                        widest = max(widest, cell.cell_len)
                column.min_width = max(widest, len(str(column.header)))
    if wide or not out.is_terminal:
        whole = Console(
            width=WIDE, highlight=False, emoji=False, force_terminal=out.is_terminal or None
        )
        whole.print(renderable)
        return
    out.print(renderable)
