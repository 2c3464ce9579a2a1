"""The journal and ``explain`` say truthfully which liveness-key case let a steal proceed."""

from __future__ import annotations

import pytest

from runfleet.ops.explain.journal_text import probe_words

HB = 1_764_000_000_000


@pytest.mark.parametrize(
    ("detail", "words"),
    [
        ({"key": "absent"}, "key absent"),
        ({"key": "missing"}, "key absent"),  # the older word for absent, still read
        ({"key": "malformed", "error": "not msgpack: StackError"}, "key malformed: not msgpack"),
        ({"key": "without-ttl", "confirmed_ms": 0}, "key without TTL"),
        ({"key": "ttl-implausible", "ttl_ms": 10**9, "max_ttl_ms": 30_000}, "above the 30.0 s"),
        ({"key": "unverified", "redis": "unreachable"}, "Redis unreachable"),
        ({"key": "unverified", "redis": "error-reply", "error": "NOPERM"}, "Redis answered"),
    ],
)
def test_lease_expired_names_the_key_case(detail: dict[str, object], words: str) -> None:
    text = probe_words("lease-expired", detail)
    assert words in text, text
    assert text.endswith("so the lease alone decided"), text


def test_inconsistent_key_shows_both_times_and_which_way() -> None:
    older = probe_words(
        "lease-expired", {"key": "inconsistent", "confirmed_ms": 0, "heartbeat_at_ms": HB}
    )
    assert "key inconsistent" in older and "0 ms after 1970" in older and "earlier" in older
    newer = probe_words(
        "lease-expired",
        {"key": "inconsistent", "confirmed_ms": HB + 5000, "heartbeat_at_ms": HB},
    )
    assert "5.0 s later" in newer and "renewed since without this run" in newer
    absurd = probe_words(
        "lease-expired", {"key": "inconsistent", "confirmed_ms": 2**63, "heartbeat_at_ms": HB}
    )
    assert "ms after 1970" in absurd  # an absurd time is printed, not raised on


def test_without_detail_the_words_claim_nothing_false() -> None:
    assert "Redis unreachable" not in probe_words("lease-expired")
    assert probe_words("same-host-pid-alive", {"key": "unverified", "redis": "unreachable"}) == (
        "its pid is running on the same host (Redis unreachable: its key was not checked)"
    )
    assert probe_words("cross-host-unreachable-stale", {"key": "absent"}) == (
        "its liveness key is absent"
    )
