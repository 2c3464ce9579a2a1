"""Hostile values for the producer API, the CLI and Redis payloads."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from store.errors import RunfleetError

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
