"""Evidence addresses (seed rule: refusals addressed by run, owner, lease and evidence kind).

A driver with a fake probe against the real store: what it journals about runs it does
not own, how often, and that a repeat is a duplicate rather than a conflict.
"""

from __future__ import annotations

import logging

import pytest

import tests.fleet.flows  # noqa: F401  (registers tests.sleepy for the driver)
from runfleet.broker.liveness import Probe
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from runfleet.worker.driver import Driver
from tests.store.helpers import OWNER_A, make_running, wait_db_time_past

ALIVE = Probe("alive", "cross-host-key-fresh", {"key": "present"})


def _driver(store: Store, settings: Settings, probe: Probe = ALIVE) -> Driver:
    async def answer(_owner: Owner, _heartbeat: int | None) -> Probe:
        return probe

    return Driver(store, Owner("observer", 7, "n"), settings, probe=answer)


async def _refusals(store: Store, run_id: str) -> list[dict[str, object]]:
    return [
        dict(r.payload)
        for r in await store.journal.records(run_id)
        if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]


async def test_refusal_is_journaled_once_per_lease_and_reason_without_conflicts(
    settings: Settings, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.evidence")
    row = await make_running(store, "r", OWNER_A, flow="tests.sleepy")
    driver = _driver(store, settings)
    # While the lease is fresh, a wake is refused by the lease alone: journaled.
    assert await driver.drive("r") == "heartbeat_fresh"
    assert await driver.drive("r") == "heartbeat_fresh"
    # The same lease, now stale, refused by the probe: a second record, not dropped.
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms + settings.stale_after_ms)
    assert await driver.drive("r") == "steal_refused_owner_alive"
    driver.ladder.forget("r")  # re-probe at once: the repeat must be a duplicate
    assert await driver.drive("r") == "steal_refused_owner_alive"
    refusals = await _refusals(store, "r")
    assert [p["evidence"] for p in refusals] == ["lease-fresh", "probe"]
    assert all(p["heartbeat_at_ms"] == row.heartbeat_at_ms for p in refusals)
    assert refusals[1]["probe"] == "cross-host-key-fresh"
    assert "journal.evidence_conflict" not in caplog.text


async def test_a_moved_lease_is_new_evidence(settings: Settings, store: Store) -> None:
    row = await make_running(store, "m", OWNER_A, flow="tests.sleepy")
    driver = _driver(store, settings)
    assert await driver.drive("m") == "heartbeat_fresh"
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms)
    await store.runs.heartbeat(OWNER_A, ["m"])  # the owner renews: a different lease
    assert await driver.drive("m") == "heartbeat_fresh"
    leases = [p["heartbeat_at_ms"] for p in await _refusals(store, "m")]
    assert len(leases) == 2 and leases[0] != leases[1]


async def test_own_run_is_never_refused_evidence(settings: Settings, store: Store) -> None:
    await make_running(store, "own", OWNER_A, flow="tests.sleepy")
    driver = Driver(store, OWNER_A, settings)
    assert await driver.drive("own") == "heartbeat_fresh"
    assert await _refusals(store, "own") == []
