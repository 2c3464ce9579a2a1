"""Seed rules about evidence and identity (also tested elsewhere; here by name).

Evidence is what a process journals about a run it does not own: a takeover it refused or
lost. The seed addresses it so that the same observation is one record however often it is
made, and never lets writing it stop a drive. Identity: re-admitting a run id compares the
payload as a JSON value. Real Postgres, the production ``Driver`` and ``Takeover``.
"""

from __future__ import annotations

import logging

import pytest

from runfleet.broker.liveness import Evidence, Probe
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.errors import ExecutionIdentityConflict
from runfleet.store.journal_records import RefusalEvidence
from runfleet.store.types import Created, Joined, NewRun, Owner
from runfleet.worker.driver import Driver
from runfleet.worker.takeover import Takeover
from tests.ops.conftest import cli_env, invoke
from tests.seed_rules import flows as sr
from tests.store.helpers import make_running, must_get, wait_db_time_past

OWNER = Owner("host-owner", 611, "nonce-owner")
WATCHER = Owner("host-watcher", 612, "nonce-watcher")
OTHER_WATCHER = Owner("host-watcher-2", 613, "nonce-watcher-2")

assert sr.waiter  # registers the flows


async def _refusals(store: Store, run_id: str) -> list[tuple[str, dict[str, object]]]:
    return [
        (r.source_id, dict(r.payload))
        for r in await store.journal.records(run_id)
        if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]


async def test_refusals_are_addressed_by_run_owner_lease_evidence_and_observer(
    store: Store, settings: Settings
) -> None:
    """One record per (run, owner, lease, evidence, observer): repeats are duplicates, and
    any part that differs is a record of its own."""
    row = await make_running(store, "r", OWNER, flow="sr.waiter")
    lease = row.heartbeat_at_ms
    mine, theirs = (Takeover(store, w, settings, None) for w in (WATCHER, OTHER_WATCHER))
    for _ in range(3):
        await mine.refused("r", OWNER, lease, RefusalEvidence.LEASE_FRESH)
    assert len(await _refusals(store, "r")) == 1, "the same observation, one record"
    await mine.refused("r", OWNER, lease, RefusalEvidence.PROBE, probe="cross-host-key-fresh")
    await theirs.refused("r", OWNER, lease, RefusalEvidence.LEASE_FRESH)
    assert lease is not None
    await mine.refused("r", OWNER, lease + 1, RefusalEvidence.LEASE_FRESH)
    refusals = await _refusals(store, "r")
    assert len(refusals) == 4
    addresses = {source for source, _ in refusals}
    assert len(addresses) == 4 and all(a.startswith(f"evidence:r:{OWNER.key}:") for a in addresses)
    assert [p["observer"] for _, p in refusals] == [
        WATCHER.key,
        WATCHER.key,
        OTHER_WATCHER.key,
        WATCHER.key,
    ]
    assert refusals[1][1] == {
        "evidence": "probe",
        "observer": WATCHER.key,
        "heartbeat_at_ms": lease,
        "probe": "cross-host-key-fresh",
    }


async def test_a_lease_vouched_for_again_by_another_witness_is_recorded_and_explained(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The witness is part of the address: the same stale lease, refused first because
    the owner's liveness key was fresh and later because its pid was alive on this host,
    is two records, not one and a conflict, and ``runfleet explain`` shows both."""
    caplog.set_level(logging.INFO, logger="runfleet.worker.evidence")
    row = await make_running(store, "r", OWNER, flow="sr.waiter")
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms + settings.stale_after_ms)
    witness: list[Evidence] = ["cross-host-key-fresh"]

    async def vouching(_owner: Owner, _heartbeat: int | None) -> Probe:
        return Probe("alive", witness[0])

    watcher = Driver(store, WATCHER, settings, probe=vouching)
    assert await watcher.drive("r") == "steal_refused_owner_alive"
    watcher.ladder.forget("r")  # re-probed at once (the ladder's next rung, without the wait)
    assert await watcher.drive("r") == "steal_refused_owner_alive"  # the same witness
    witness[0] = "same-host-pid-alive"
    watcher.ladder.forget("r")
    assert await watcher.drive("r") == "steal_refused_owner_alive"
    refusals = [p for _, p in await _refusals(store, "r")]
    assert [p["probe"] for p in refusals] == ["cross-host-key-fresh", "same-host-pid-alive"]
    assert {p["heartbeat_at_ms"] for p in refusals} == {row.heartbeat_at_ms}
    assert "journal.evidence_conflict" not in caplog.text
    text = await invoke(cli_env(settings), "explain", "r")
    assert text.code == 0, text
    assert "its liveness key is fresh and matches the lease" in text.stdout, text.stdout
    assert "its pid is running on the same host" in text.stdout, text.stdout


async def test_a_wake_refused_by_a_fresh_lease_is_journaled(
    store: Store, settings: Settings
) -> None:
    """An operator whose wake did nothing sees why: a live owner's fresh lease was in the way.
    The owner's own drive journals no refusal about itself."""
    row = await make_running(store, "r", OWNER, flow="sr.waiter")
    assert await Driver(store, WATCHER, settings).drive("r") == "heartbeat_fresh"
    ((_, refusal),) = await _refusals(store, "r")
    assert refusal["evidence"] == "lease-fresh" and refusal["observer"] == WATCHER.key
    assert refusal["heartbeat_at_ms"] == row.heartbeat_at_ms
    assert await Driver(store, OWNER, settings).drive("r") == "heartbeat_fresh"
    assert len(await _refusals(store, "r")) == 1


async def test_evidence_that_cannot_be_written_never_stops_a_drive(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal refusing an evidence write (injected: one call) leaves the drive's
    answer as it was; the run is untouched."""
    row = await make_running(store, "r", OWNER, flow="sr.waiter")

    async def broken(*_args: object, **_kwargs: object) -> object:
        raise ConnectionError("journal unreachable")

    monkeypatch.setattr(store.journal, "emit", broken)
    assert await Driver(store, WATCHER, settings).drive("r") == "heartbeat_fresh"
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms + settings.stale_after_ms)

    async def vouching(_owner: Owner, _heartbeat: int | None) -> Probe:
        return Probe("alive", "cross-host-key-fresh")

    refusing = Driver(store, WATCHER, settings, probe=vouching)
    assert await refusing.drive("r") == "steal_refused_owner_alive"
    after = await must_get(store, "r")
    assert after.owner == OWNER and after.epoch == row.epoch
    monkeypatch.undo()
    assert await _refusals(store, "r") == []


async def test_a_rejoined_run_compares_payloads_by_json_value(store: Store) -> None:
    """Key order is not part of a JSON object, and 1.0 and 1 (or -0.0 and 0) are one JSON
    number; a value that differs is a conflict naming the payload."""
    first = await store.admission.create(
        NewRun(id="j", flow="sr.waiter", payload={"args": [1.0, -0.0], "kwargs": {"a": 1, "b": 2}})
    )
    assert isinstance(first, Created)
    again = await store.admission.create(
        NewRun(id="j", flow="sr.waiter", payload={"kwargs": {"b": 2, "a": 1}, "args": [1, 0]})
    )
    assert isinstance(again, Joined)
    with pytest.raises(ExecutionIdentityConflict) as caught:
        await store.admission.create(
            NewRun(id="j", flow="sr.waiter", payload={"args": [1, 0], "kwargs": {"a": 1}})
        )
    assert caught.value.field == "payload"
