"""The stored canonical form of JSON values: recorded calls, payloads, results, completions.

A recorded value must come back from Postgres identical in value *and* type, or
replay changes what a flow sees (jsonb rewrites ``1e16`` as ``10000000000000000``,
``-0.0`` as ``0.0``, and Python then reads an int where the flow had a float). So a
value is stored as the exact text of ``encode_canonical`` in a ``json`` column
(which keeps the text it is given), its digest is taken over that very text, and
replay decodes that text: Python's float ``repr`` round-trips every double, and
integers are written in full.

What cannot be stored that way is refused here, before anything is written, with
``UnstorableValue`` naming what is wrong and where: a permanent error about the
value, never an infrastructure failure to retry.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg

from runfleet.store.errors import InvalidInput

MAX_DEPTH = 512
"""Deepest nesting accepted: decoding stays well inside Python's recursion limit."""


class UnstorableValue(InvalidInput):
    """A value cannot be recorded (not JSON, too large, NUL, lone surrogate, too deep).

    Permanent: the same value fails the same way every time, so it fails the run (a
    result) or raises into the flow (a step output) once, and is never retried.
    ``field`` names the value (``state``, ``step output of step:a#1``), ``problem``
    what is wrong with it and at which JSON path (``$["result"][3]``).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.args = (f"cannot store {field}: {problem}",)


def _path(parts: Sequence[str | int]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f"[{json.dumps(p)}]" for p in parts)


def _scalar_problem(value: Any) -> str | None:
    """What makes a scalar unstorable, or None (containers are checked by the walk)."""
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character (U+0000), which Postgres text and jsonb refuse"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "contains a lone surrogate, which is not valid Unicode text"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value!r}, which JSON cannot represent"
    if isinstance(value, int | bool | type(None) | float):
        return None
    return f"is a {type(value).__name__}, which is not a JSON value"


def check(value: Any, where: str, at: Sequence[str | int] = ()) -> None:
    """Raise UnstorableValue if ``value`` is not a JSON value that round-trips exactly.

    Iterative, so hostile nesting cannot exhaust the stack; the depth bound also
    ends a cycle. Dict keys must be strings: JSON would turn ``{1: …}`` into
    ``{"1": …}`` and replay would hand back a different dict.
    """
    stack: list[tuple[Any, int, list[str | int]]] = [(value, 1, list(at))]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list | tuple):
            items = enumerate(node)
        else:
            problem = _scalar_problem(node)
            if problem:
                raise UnstorableValue(where, f"{_path(path)} {problem}")
            continue
        if depth > MAX_DEPTH:
            raise UnstorableValue(
                where, f"{_path(path[:8])}… is nested deeper than {MAX_DEPTH} levels"
            )
        for key, item in items:
            if isinstance(node, dict):
                if not isinstance(key, str):
                    raise UnstorableValue(
                        where,
                        f"{_path(path)} has a {type(key).__name__} key {key!r}; "
                        "JSON object keys are strings",
                    )
                problem = _scalar_problem(key)
                if problem:
                    raise UnstorableValue(where, f"a key of {_path(path)} {problem}")
            if isinstance(item, dict | list | tuple):
                stack.append((item, depth + 1, [*path, key]))
            elif not isinstance(item, int | bool | type(None)):  # the cheap, common case
                problem = _scalar_problem(item)
                if problem:
                    raise UnstorableValue(where, f"{_path([*path, key])} {problem}")


_PLAIN = frozenset({str, int, float, bool, type(None)})
# A JSON "\u0000" escape: after an even number of backslashes (zero included), so a
# literal backslash followed by "u0000" (encoded as "\\u0000") is not one.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _plain_shape(value: Any) -> bool:
    """Whether ``value`` is plainly JSON-shaped: containers within MAX_DEPTH, str keys,
    nothing but the plain scalar types. Scans scalars in C (``set(map(type, …))``), so
    large values are cheap; scalar *contents* (NaN, NUL, surrogates) are left to the
    encoder. False sends the value through ``check``, which names the problem."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if node and set(map(type, node)) != {str}:
                return False
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            return type(node) in _PLAIN
        if depth > MAX_DEPTH:
            return False
        if set(map(type, children)) <= _PLAIN:
            continue
        for child in children:
            if isinstance(child, dict | list | tuple):
                stack.append((child, depth + 1))
            elif type(child) not in _PLAIN:
                return False
    return True


def encode_canonical(value: Any, limit: int, where: str, at: Sequence[str | int] = ()) -> str:
    """The canonical JSON text of ``value`` (sorted keys, no spaces, UTF-8), or UnstorableValue.

    ``where`` and ``at`` (the path of ``value`` inside it) name the value in errors.

    The same text ``store.types.canonical_json`` produces, so a value's digest is the
    same whether taken over the value or over its stored text.
    """
    if not _plain_shape(value):
        check(value, where, at)
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        if "\\u0000" in text and _NUL_ESCAPE.search(text):
            raise ValueError("a NUL character")
        size = len(text.encode("utf-8"))  # UnicodeEncodeError (a ValueError): a lone surrogate
    except (TypeError, ValueError, RecursionError) as exc:  # e.g. NaN, an int over 4300 digits
        check(value, where, at)  # names the problem and where it is
        raise UnstorableValue(where, f"{_path(at)} cannot be encoded as JSON ({exc})") from None
    if size > limit:
        raise UnstorableValue(where, f"{_path(at)} is {size} bytes encoded, the limit is {limit}")
    return text


class Undecodable(str):
    """A stored JSON value this process cannot turn into Python, as its readers show it.

    Postgres accepts nesting far deeper than Python's ``json`` (which gives up past
    ~1,000 levels), so a row written before the depth cap (migration 0030), or by a role
    the cap does not hold, may carry one. Every reader renders it (``<undecodable: ...>``)
    and goes on; a worker fails a run whose payload is one (store/rows.py,
    worker/authoring/context.py) rather than run it with a string in place of its arguments.
    """

    __slots__ = ()

    @classmethod
    def of(cls, text: str, exc: BaseException) -> Undecodable:
        why = "nested deeper than Python decodes" if isinstance(exc, RecursionError) else exc
        return cls(f"<undecodable: {why}; {len(text.encode('utf-8', 'surrogatepass'))} bytes>")


def decode(text: str) -> Any:
    """The value a stored canonical text holds (floats stay floats, big ints stay ints)."""
    return json.loads(text)


def text_digest(text: str) -> str:
    """The digest recorded with a stored value: over exactly the text stored."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def is_canonical(text: str) -> bool:
    """Whether ``text`` is in canonical form (rows stored before migration 0003 are not)."""
    try:
        value = json.loads(text)
        again = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return False
    return again == text


def refused_by_database(exc: BaseException) -> bool:
    """Whether Postgres refused a write because of the data itself (never worth a retry).

    Data exceptions (SQLSTATE class 22: an unsupported Unicode escape, a value out of
    range) and program limits (class 54: too deeply nested, too large) fail the same
    way every time; connection trouble is not this.
    """
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate or ""
    return isinstance(exc, psycopg.DataError) or state[:2] in ("22", "54")


_JSONB_ESCAPES = {'"': 2, "\\": 2, "\b": 2, "\f": 2, "\n": 2, "\r": 2, "\t": 2}


def _jsonb_string_size(text: str) -> int:
    """Bytes of ``text`` as Postgres writes a jsonb string: quoted, UTF-8, escaped."""
    size = len(text.encode("utf-8", "surrogatepass")) + 2
    for char in text:
        if char < " " or char in ('"', "\\"):
            size += _JSONB_ESCAPES.get(char, 6) - 1
    return size


def jsonb_text_size(value: Any) -> int:
    """Bytes of ``value`` as Postgres renders it from jsonb (``jsonb::text``): what a
    reader of the column receives, and what the database measures its limits on
    (migration 0013). Not the compact JSON the value was sent as: jsonb writes ``", "``
    and ``": "`` between items, strings in UTF-8, and numbers in full (``1e300`` comes
    back as 301 digits). ``value`` is JSON-shaped (``json.dumps`` accepts it).
    """
    size = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if item is None or item is True:
            size += 4
        elif item is False:
            size += 5
        elif isinstance(item, str):
            size += _jsonb_string_size(item)
        elif isinstance(item, int | float):
            size += len(format(_number(item), "f"))
        elif isinstance(item, dict):
            size += 2 + 2 * max(0, len(item) - 1)
            for key, nested in item.items():
                size += _jsonb_string_size(str(_key(key))) + 2
                stack.append(nested)
        else:  # a list or tuple
            size += 2 + 2 * max(0, len(item) - 1)
            stack.extend(item)
    return size


def _number(value: int | float) -> Decimal:
    """A JSON number as the decimal it is written as (floats by their shortest repr)."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _key(key: object) -> object:
    """An object key as JSON text has it (``json.dumps`` turns 1 into "1", True into "true")."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return repr(key)
    return json.dumps(key)


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value.

    Numbers compare by the decimal they denote, whatever Python type carries them:
    ``1e16`` equals jsonb's ``10000000000000000``, ``-0.0`` equals ``0.0``, ``1.0``
    equals ``1`` (JSON has one number type, and jsonb keeps neither the sign of zero
    nor the exponent). Booleans are not numbers; arrays compare in order, objects by
    keys; strings exactly. Iterative, so nesting depth is not bounded by the stack.
    """
    stack: list[tuple[Any, Any]] = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, bool) or isinstance(y, bool):
            if not (isinstance(x, bool) and isinstance(y, bool) and x == y):
                return False
        elif isinstance(x, int | float) and isinstance(y, int | float):
            if _number(x) != _number(y):
                return False
        elif isinstance(x, dict) and isinstance(y, dict):
            xs = {_key(k): v for k, v in x.items()}
            ys = {_key(k): v for k, v in y.items()}
            if xs.keys() != ys.keys():
                return False
            stack.extend((v, ys[k]) for k, v in xs.items())
        elif isinstance(x, list | tuple) and isinstance(y, list | tuple):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif not ((isinstance(x, str) and isinstance(y, str)) or (x is None and y is None)):
            return False
        elif x != y:
            return False
    return True
