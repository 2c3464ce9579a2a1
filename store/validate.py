"""Input checks at the store boundary: bad input raises InvalidInput and writes nothing."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from store.errors import InvalidInput
from store.types import RunStatus

MAX_ID_LENGTH = 255
# A JSON "\u0000" escape: preceded by an even number of backslashes (zero included), so
# the text of a literal backslash followed by "u0000" (escaped as "\\u0000") is not one.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def identifier(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInput(field, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput(field, f"is {len(value)} characters, the limit is {MAX_ID_LENGTH}")
    if value.isascii() and value.isprintable():
        return value  # the common case, checked in C: no control character, no surrogate
    if _CONTROL.search(value):
        raise InvalidInput(field, "must not contain control characters")
    if _SURROGATE.search(value):
        raise InvalidInput(field, "must not contain lone surrogates (not encodable as UTF-8)")
    return value


def json_value(field: str, value: Any, max_bytes: int) -> str:
    """Canonical JSON text of ``value``; refuses NaN, non-JSON types and oversized values."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, f"is not JSON-serialisable ({exc})") from None
    if _NUL_ESCAPE.search(text):
        raise InvalidInput(field, "contains a NUL character, which Postgres jsonb refuses")
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidInput(field, f"is {size} bytes encoded, the limit is {max_bytes}")
    return text


def status(value: object, field: str = "status") -> RunStatus:
    try:
        return RunStatus(str(value))
    except ValueError:
        allowed = ", ".join(s.value for s in RunStatus)
        raise InvalidInput(field, f"{value!r} is not one of {allowed}") from None


def finite_ms(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(field, f"must be a finite number of milliseconds, got {value!r}")
    return int(value)


def timeout_ms(seconds: float) -> int:
    """A timeout of ``seconds`` as whole milliseconds, the unit every deadline is kept in.

    Rounded up when positive, so a sub-millisecond timeout is 1 ms, never the zero that
    would put the deadline at admission (``job_timeout=0.1`` is 100 ms, not 0 s); zero
    and negative are truncated as given.
    """
    return math.ceil(seconds * 1000) if seconds > 0 else int(seconds * 1000)
