"""Each ending's constructor alone (``store.settlements``), then one committed by ``settle``."""

from __future__ import annotations

from runfleet.store import Kind, Store, settlements
from runfleet.store import journal_records as jr
from runfleet.store.types import RunError, RunStatus, Settle, Transitioned
from tests.store.helpers import OWNER_A, make_running, must_get


def kind(item: Settle) -> Kind:
    """The kind of the record ``item`` journals."""
    return settlements.journaled(item).KIND


def test_each_ending_carries_its_status_kind_and_record() -> None:
    done = settlements.completed("r", 3, {"x": 1})
    assert (done.run_id, done.epoch, done.status, kind(done)) == (
        "r",
        3,
        RunStatus.COMPLETED,
        Kind.TRANSITIONED,
    )
    assert done.patch == {"result": {"x": 1}} and done.guard
    assert done.record == jr.Transitioned(to=RunStatus.COMPLETED, epoch=3)

    failed = settlements.failed("r", 3, RunError(type="ValueError"))
    assert failed.status is RunStatus.FAILED and kind(failed) == Kind.TRANSITIONED
    assert failed.patch == {"error": {"type": "ValueError"}} and failed.guard
    assert failed.record == jr.Transitioned(to=RunStatus.FAILED, epoch=3)

    cancelled = settlements.cancelled("r", 3, OWNER_A, found_at="shutdown")
    assert cancelled.status is RunStatus.CANCELLED and kind(cancelled) == Kind.INTERRUPTED
    assert not cancelled.guard, "the cancel itself is never refused by the cancel guard"
    assert cancelled.record == jr.Interrupted(
        to=RunStatus.CANCELLED, epoch=3, cancelled=True, found_at_release="shutdown"
    )
    assert cancelled.patch == {
        "cancellation": {"acknowledged_by": OWNER_A.key, "found_at_release": "shutdown"}
    }
    assert settlements.journaled(settlements.cancelled("r", 3, OWNER_A)).dump() == {
        "to": "cancelled",
        "epoch": 3,
        "cancelled": True,
    }

    exhausted = settlements.lineage_exhausted("r", 3, 4)
    assert exhausted.status is RunStatus.FAILED and kind(exhausted) == Kind.LINEAGE_EXHAUSTED
    assert exhausted.record == jr.LineageExhausted(to=RunStatus.FAILED, epoch=3, max_rounds=4)
    assert exhausted.patch["error"] == {
        "type": "LineageExhausted",
        "message": "max_rounds=4 reached",
    }

    invalid = settlements.round_invalid("r", 3, RunError(type="InvalidHandoff"), "r@1")
    assert invalid.status is RunStatus.FAILED and kind(invalid) == Kind.ROUND_INVALID
    assert invalid.record == jr.RoundInvalid(to=RunStatus.FAILED, epoch=3, successor="r@1")
    assert invalid.patch == {"error": {"type": "InvalidHandoff"}}


async def test_settle_commits_an_ending_with_its_kind_and_record(store: Store) -> None:
    row = await make_running(store, "r", OWNER_A)
    outcome = await store.lifecycle.settle(
        OWNER_A, settlements.lineage_exhausted(row.id, row.epoch, 2)
    )
    assert isinstance(outcome, Transitioned)
    assert (await must_get(store, "r")).status is RunStatus.FAILED
    (last,) = [r for r in await store.journal.records("r") if r.kind == Kind.LINEAGE_EXHAUSTED]
    assert last.payload["max_rounds"] == 2 and last.payload["to"] == "failed"


def test_a_settlement_without_a_record_journals_a_plain_transition() -> None:
    """A hand-built ``Settle`` (no record): the store journals ``transitioned``, and a
    record built with other ``to``/``epoch`` is stamped with the settlement's own."""
    plain = Settle("r", 3, RunStatus.FAILED, {})
    assert kind(plain) == Kind.TRANSITIONED
    assert settlements.journaled(plain) == jr.Transitioned(to=RunStatus.FAILED, epoch=3)
    stamped = Settle("r", 3, RunStatus.FAILED, {}, jr.LineageExhausted(max_rounds=2))
    assert kind(stamped) == Kind.LINEAGE_EXHAUSTED
    assert settlements.journaled(stamped).dump() == {"to": "failed", "epoch": 3, "max_rounds": 2}
