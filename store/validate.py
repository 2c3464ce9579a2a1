"""Input checks at the store boundary: bad input raises InvalidInput and writes nothing."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import psycopg

from runfleet.store.errors import InvalidInput
from runfleet.store.types.run import RunStatus
from runfleet.store.values import jsonb_text_size

MAX_ID_LENGTH = 255
# A JSON "\u0000" escape: preceded by an even number of backslashes (zero included), so
# the text of a literal backslash followed by "u0000" (escaped as "\\u0000") is not one.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


MAX_PRIORITY = 1_000_000
"""Priorities are within +-MAX_PRIORITY, as the runs.priority CHECK holds (migration 0015)."""


def priority(value: object, field: str = "priority") -> int:
    """A run or queue priority: an int (not a bool) within +-MAX_PRIORITY."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer, got {type(value).__name__}")
    if not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidInput(field, f"must be between {-MAX_PRIORITY} and {MAX_PRIORITY}")
    return value


def count(field: str, value: object) -> int:
    """A whole number >= 0 (not a bool); InvalidInput otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(field, f"must be a whole number >= 0, got {value!r}")
    return value


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


STATE_KEYS_CAPPED = ("meta", "description", "result")
"""State keys each held to the payload cap as stored (the database says the same)."""
STATE_FACTOR = 4
"""A run's whole state may take this many times the payload cap as stored: room for
meta, description and the rest of what admission records, and a meta saved later."""


_EXPONENT = re.compile(r"[0-9][eE][+-]?[0-9]")


def _stored_at_most(value: Any) -> int | None:
    """A cheap upper bound of ``values.jsonb_text_size(value)``, or None if there is none.

    From compact ASCII JSON (C-fast): jsonb adds one space per ``,`` and ``:`` and writes
    UTF-8 where this text has ``\\uXXXX``; numbers come back as written unless in
    exponent form (``1e+300``), which only the exact walk can size.
    """
    try:
        text = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    if _EXPONENT.search(text):
        return None
    return len(text) + text.count(",") + text.count(":")


def stored_jsonb(field: str, value: Any, max_bytes: int) -> None:
    """Refuse ``value`` if Postgres's rendering of it as jsonb exceeds ``max_bytes``.

    That is the size a reader of the column receives, and what the database measures
    (migration 0013's ``runfleet.producer_state_ok``); compact JSON can be much shorter
    (jsonb writes ``", "``, and ``1e300`` in full).
    """
    bound = _stored_at_most(value)
    if bound is not None and bound <= max_bytes:
        return
    size = jsonb_text_size(value)
    if size > max_bytes:
        raise InvalidInput(field, f"is {size} bytes as stored (jsonb), the limit is {max_bytes}")


def run_state(state: Mapping[str, Any], max_bytes: int) -> None:
    """The limits the database holds a producer's run state to, checked first so the API
    raises InvalidInput naming the field: meta, description and a result each within
    ``max_bytes``, the whole state within ``STATE_FACTOR`` times it, as stored."""
    bound = _stored_at_most(state)
    if bound is not None and bound <= max_bytes:
        return  # every part is within the cap too: the common case, one json.dumps
    for key in STATE_KEYS_CAPPED:
        if key in state:
            stored_jsonb(key, state[key], max_bytes)
    stored_jsonb("state", dict(state), STATE_FACTOR * max_bytes)


def database_refusal(exc: BaseException) -> InvalidInput | None:
    """A limit the database enforced itself (migration 0013's ``runfleet.refuse``: a
    check_violation naming the column) as the InvalidInput the API raises for it; None
    for any other error. Reached when the database's limits (``runfleet roles --apply``)
    are tighter than this process's settings."""
    if not isinstance(exc, psycopg.errors.CheckViolation):
        return None
    message = exc.diag.message_primary or ""
    if not message.startswith("runfleet refuses "):
        return None
    field = exc.diag.column_name or "value"
    problem = message.removeprefix(f"runfleet refuses {field}: ")
    return InvalidInput(field, f"{problem} (refused by the database)")


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
