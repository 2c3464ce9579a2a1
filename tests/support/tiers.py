"""Which tests belong to which tier, and which need the machine to themselves.

`make test` runs the suite in two passes: every test not marked ``serial`` (on
``WORKERS`` pytest-xdist workers at once), then the ``serial`` ones alone. A test is ``serial`` when
what it proves is a bound in seconds (a rate within 5 %, a failover budget, a probe
bounded by its timeout): beside three other busy workers on a two-core box it would
measure the box, not the code. Its bound is never loosened to run it in parallel.

The tiers (``chaos``, ``partition``, ``ha``, ``bench``) are what `make test-fast` leaves
out. ``chaos`` is written in the test modules themselves (``pytestmark``); the others are
whole folders or files and are named here, with the serial list, so one table says what
runs where. tests/test_tiers.py proves every entry still names a test that exists.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SERIAL: dict[str, str] = {
    "tests/partition/": "a takeover within stale_after + 3 s; a frozen host's write window",
    "tests/ha/": "Unavailable after a 2 s budget and before 5 s; 40 s budgets across a failover",
    "tests/queues/test_rate_limit.py::test_three_workers_hold_the_rate_within_five_percent": (
        "R/s within 5 % over a minute across three worker processes"
    ),
    "tests/queues/test_keys_fleet.py::test_a_late_key_starts_while_a_burst_drains": (
        "a late key's runs all start within 20 s"
    ),
    "tests/fleet/test_backlog_wakes.py::test_a_refused_publish_is_found_within_the_bound": (
        "a lost wake is found within lost_wake_within_ms + 3 s"
    ),
    "tests/fleet/test_redis_state.py": (
        "a run starts within lost_wake_within_ms + 3 s whatever Redis command stranded it"
    ),
    "tests/queues/test_keys_fleet.py::test_unkeyed_runs_cannot_starve_a_keyed_one": (
        "a keyed run starts within 5 s behind 1,500 unkeyed runs"
    ),
    "tests/chaos/test_producers.py": "Unavailable no sooner than the budget, no later than +3 s",
    "tests/scale/test_pgbouncer_fleet.py": (
        "16 worker processes settle 480 five-step runs within 120 s of four SIGKILLs"
    ),
    "tests/broker/test_liveness_consistency.py::"
    "test_probe_is_bounded_by_its_timeout_against_a_silent_redis": (
        "a probe returns within its 0.1 s timeout + 0.2 s"
    ),
    "tests/broker/test_liveness_consistency.py::test_concurrent_probes_stay_bounded": (
        "50 concurrent probes each answer within the probe's timeout"
    ),
    "tests/worker/test_lease_unit.py::test_renewals_keep_their_interval_when_each_takes_a_while": (
        "renewals keep their interval within 0.8 x a slow renewal"
    ),
    "tests/embedded/test_embedded.py::"
    "test_a_worker_and_a_producer_reach_a_first_result_cold_and_warm": (
        "a first result within 30 s of a cold data directory, 15 s warm"
    ),
    "tests/flows/test_waits.py::test_long_sleep_parks_on_a_durable_clock": (
        "a 2.5 s durable sleep wakes within 1.5 s of its timer"
    ),
    "tests/security/test_stop_always.py": (
        "a worker process exits within its stop deadline (grace 1 s + 2 s) of one SIGTERM"
    ),
}
"""Node-id prefixes of the tests that run alone, each with the bound that needs it."""

TIERS: dict[str, tuple[str, ...]] = {
    "partition": ("tests/partition/",),
    "ha": ("tests/ha/",),
    "bench": (
        "tests/bench/test_peers_smoke.py",
        "tests/bench/test_backlog_smoke.py",
        "tests/scale/test_capacity_bench.py",
        "tests/scale/test_limits_bench.py",
    ),
}
"""Markers given by place: whole suites `make test-fast` leaves out with ``chaos``."""

FAST_EXCLUDES = ("chaos", "partition", "ha", "bench", "serial")
"""What `make test-fast` deselects (its ``-m`` expression is built from this tuple)."""

HEAVY_FIRST: tuple[str, ...] = (
    "tests/chaos/test_backlog_chaos.py",
    "tests/bench/test_peers_smoke.py",
    "tests/bench/test_backlog_smoke.py",
    "tests/packaging/test_wheel.py",
)
"""Modules that take a minute or more, handed to the xdist workers first.

The parallel pass ends when its last module does: one of these drawn last would run
alone at the end while the other workers idle (longest first is the usual makespan rule).
"""


def _matches(nodeid: str, prefix: str) -> bool:
    """``prefix`` is a folder (ending in ``/``), a file, or a test (any of its params)."""
    if prefix.endswith("/"):
        return nodeid.startswith(prefix)
    return nodeid == prefix or nodeid.startswith((f"{prefix}::", f"{prefix}["))


def markers_for(nodeid: str) -> set[str]:
    """The tier and ``serial`` markers a test gets from where it lives (``nodeid``)."""
    found = {tier for tier, places in TIERS.items() if any(_matches(nodeid, p) for p in places)}
    if any(_matches(nodeid, prefix) for prefix in SERIAL):
        found.add("serial")
    return found


def heavy_rank(nodeid: str) -> int:
    """Sort key that moves the heavy modules first, in table order; others keep theirs."""
    module = nodeid.split("::", 1)[0]
    return HEAVY_FIRST.index(module) if module in HEAVY_FIRST else len(HEAVY_FIRST)


def fast_expression() -> str:
    """The ``-m`` expression of `make test-fast`."""
    return "not (" + " or ".join(FAST_EXCLUDES) + ")"


def apply(items: list[pytest.Item]) -> None:
    """Mark ``items`` by place and put the heavy modules first (a stable sort)."""
    for item in items:
        for name in sorted(markers_for(item.nodeid)):
            item.add_marker(getattr(pytest.mark, name))
    items.sort(key=lambda item: heavy_rank(item.nodeid))


def unknown(entries: Iterable[str], nodeids: Iterable[str]) -> list[str]:
    """Entries of the tables that match none of ``nodeids`` (a renamed or moved test)."""
    ids = list(nodeids)
    return [e for e in entries if not any(_matches(i, e) for i in ids)]
