"""Hostile values for the producer API, the CLI and Redis payloads."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from runfleet.store.errors import RunfleetError

DEEP: Any = []
for _ in range(5000):
    DEEP = [DEEP]
"""Nesting past the interpreter's recursion limit (once a RecursionError out of enqueue)."""

LONE_SURROGATE = "\ud800"
NUL = "\x00"

odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", NUL, f"a{NUL}b", LONE_SURROGATE, "x" * 300, "é/child:x#1", "r@7"]),
)
odd_numbers = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 2**64, -(2**64)]),
)
leaves = st.one_of(st.none(), st.booleans(), odd_numbers, odd_text, st.binary(max_size=8))
json_ish = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(odd_text, st.integers()), inner, max_size=4),
        st.sets(st.integers(), max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
)
anything = st.one_of(json_ish, st.sampled_from([object(), print, ..., type]))
"""(``DEEP`` is passed by explicit tests: hypothesis cannot print it when reporting.)"""


def typed(exc: BaseException) -> bool:
    """A typed refusal: runfleet's own error (with the field named when it is input)."""
    return isinstance(exc, RunfleetError)


# ---- the CLI's durations and counts -------------------------------------------------

HUGE_DAYS = "99999999999999999999999d"
"""A duration past what ``timedelta`` holds (``prune --settled-before``): refused by name,
no OverflowError."""
durations = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A\s?[0-9]{1,30}(\.[0-9]{1,6})?\s?(ms|s|m|min|h|d)?\s?\Z"),
    st.sampled_from(
        [HUGE_DAYS, "9" * 400, "9" * 400 + "d", "36500d", "36501d", "-1s", "1e9s", "nan", "inf",
         "0", "0.0000001ms", "١٢s", "0001-01-01", "0001-01-01T00:00:00+14:00", "9999-12-31",
         "9999-12-31T23:59:59-14:00", "2024-02-30", "2024-01-01T00:00:00Z", NUL, LONE_SURROGATE]
    ),
)  # fmt: skip
"""Anything typed where the CLI wants a duration (or a time): text, numbers past every
limit, ISO times at the calendar's ends."""
counts = st.one_of(
    st.integers().map(str),
    st.integers(min_value=2**31 - 2, max_value=2**70).map(str),
    st.text(max_size=12),
    st.sampled_from(["-1", "0", "1", str(2**63), "1e3", " 5", "0x10", "١٢", "1_000", "65536"]),
)
"""Anything typed where the CLI wants a count."""


# ---- run ids: every shape the store accepts ------------------------------------------

_ID_CHARS = st.characters(
    exclude_categories=["Cs"], exclude_characters=[*(chr(c) for c in range(0x20)), "\x7f"]
)
_URL_CHARS = st.sampled_from([*"/?#%\\&=+.;:@~!$'()*,[]{}|^`\"<> ", "%2F", "%2e", "é", "\u202e"])
_segment = st.text(_ID_CHARS, min_size=1, max_size=12)
valid_run_ids = st.one_of(
    st.text(_ID_CHARS, min_size=1, max_size=40),
    st.lists(_URL_CHARS, min_size=1, max_size=10).map("".join),
    st.builds(lambda p, f, n: f"{p}/child:{f}#{n}", _segment, _segment, st.integers(1, 99)),
    st.builds(lambda p, f, n: f"{p}/spawn:{f}#{n}", _segment, _segment, st.integers(1, 99)),
    st.builds(lambda p, n: f"{p}@{n}", _segment, st.integers(0, 99)),
    st.sampled_from([".", "..", "...", "/", "//", "a/..", "../a", "a/./b", "%2e%2e", "%2F", "%",
                     "a/explain", "a/cancel", "a/cancel?", "x\\..\\a", "?id=a", "#", "\x85",
                     "\u2028", "\ufeff", "x" * 255]),
).filter(lambda s: 0 < len(s) <= 255)  # fmt: skip
"""Ids ``store.validate.identifier`` accepts (any text without C0, DEL or surrogates, at
most 255 characters), weighted to the shapes a URL can misread: child and spawn ids
(``/``, ``#``), round ids (``@``), dot segments, percent signs, query and fragment marks."""
