"""A producer's calls on an existing run (``producer.control``): what each checks before it
writes, and what it says when it refuses. Real Postgres and Redis, the production
``AsyncQueue``; the runs are parked through the store, as a worker leaves them.
"""

from __future__ import annotations

import logging

import pytest

from runfleet.broker.streams import Lane
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer import AsyncQueue
from runfleet.producer.control import RunControl
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import CancelRequestFailed, InvalidInput, ScopeDenied
from runfleet.store.types import Waiting, WaitingReason
from runfleet.store.waits import token_hash
from tests.store.helpers import create, make_parked, must_get


async def test_every_call_on_a_run_checks_the_producers_scopes_before_it_writes(
    store: Store, settings: Settings
) -> None:
    """A producer whose scopes do not cover the run changes nothing, whatever it calls."""
    approval = Waiting(WaitingReason.APPROVAL, token=token_hash("tok"))
    await make_parked(store, "ap", approval, scopes=("tenant-a",), deferred="approval")
    await make_parked(store, "ev", Waiting(WaitingReason.EVENT), scopes=("tenant-a",))
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD), scopes=("tenant-a",))
    async with AsyncQueue("default", settings=settings, scopes=["tenant-b"]) as stranger:
        with pytest.raises(ScopeDenied):
            await stranger.approve("ap", "tok", actor="mallory")
        with pytest.raises(ScopeDenied):
            await stranger.deny("ap", "tok", actor="mallory")
        with pytest.raises(ScopeDenied):
            await stranger.complete("ev", "paid", 1)
        with pytest.raises(ScopeDenied):
            await stranger.resume("dead")
        with pytest.raises(ScopeDenied):
            await stranger.cancel("ev")
    for run_id in ("ap", "ev", "dead"):
        row = await must_get(store, run_id)
        assert row.waiting is not None and row.cancel_requested_at_ms is None, run_id
    kinds = {r.kind for run_id in ("ap", "ev", "dead") for r in await store.journal.records(run_id)}
    assert not kinds & {"approval-approved", "approval-denied", "resumed", "cancel-requested"}


async def test_an_unsafe_interrupt_is_refused_naming_the_run_and_the_way_to_cancel(
    store: Store, queue: AsyncQueue
) -> None:
    await create(store, "r")
    with pytest.raises(CancelRequestFailed) as info:
        await queue.interrupt_unsafe("r")
    assert info.value.code == "unsafe_interrupt_unsupported" and info.value.run_id == "r"
    assert info.value.retryable is False
    assert info.value.reason.startswith("use cancel(): it is durable"), info.value.reason
    assert (await must_get(store, "r")).cancel_requested_at_ms is None


async def test_a_dead_run_is_resumed_without_options_and_only_once(
    store: Store, queue: AsyncQueue
) -> None:
    """A run parked ``dead`` takes neither quarantine option; resumed without one (the
    collaborator's own defaults included), its wait is cleared and its resume journaled
    with the caller's note; a second resume finds it no longer dead."""
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    for options in ({"accept_recorded": True}, {"rerun_step": "step:a#1"}):
        with pytest.raises(InvalidInput) as refused:
            await queue.resume("dead", **options)
        assert refused.value.field == "resume", options
        assert refused.value.problem == "run 'dead' is parked dead: resume it without options"
    assert (await must_get(store, "dead")).waiting is not None, "nothing written"
    await RunControl(queue.session).resume("dead", actor="ops")
    revived = await must_get(store, "dead")
    assert revived.waiting is None
    (record,) = [r.payload for r in await store.journal.records("dead") if r.kind == "resumed"]
    assert record["from"] == "dead" and record["note"] == "ops", record
    with pytest.raises(InvalidInput) as again:
        await queue.resume("dead")
    assert again.value.field == "run_id"
    assert again.value.problem == "run 'dead' is not quarantined or parked dead"


async def test_a_run_neither_dead_nor_quarantined_is_not_resumed(
    store: Store, queue: AsyncQueue
) -> None:
    await make_parked(store, "ev", Waiting(WaitingReason.EVENT))
    with pytest.raises(InvalidInput) as refused:
        await queue.resume("ev", accept_recorded=True)
    assert refused.value.field == "run_id"
    assert refused.value.problem == "run 'ev' is not quarantined"
    assert (await must_get(store, "ev")).waiting is not None


@pytest.mark.parametrize("approved", [True, False])
async def test_an_answered_approval_wakes_its_run_on_the_recovery_lane(
    store: Store, queue: AsyncQueue, approved: bool
) -> None:
    """Approve or deny writes the decision, then wakes the run: one wake, on the recovery
    lane (the run already started), for the run, with the approval's reason."""
    approval = Waiting(WaitingReason.APPROVAL, token=token_hash("tok"))
    await make_parked(store, "ap", approval, deferred="approval")
    answer = queue.approve if approved else queue.deny
    await answer("ap", "tok", {"limit": 5}, actor="alice", reason="budget")
    kind = "approval-approved" if approved else "approval-denied"
    (decision,) = [r.payload for r in await store.journal.records("ap") if r.kind == kind]
    assert decision["reason"] == "budget" and decision["note"] == "alice", decision
    (woken,) = await queue.streams.read("c1", [queue.name], count=4, block_ms=0)
    assert (woken.message.run, woken.lane) == ("ap", Lane.RECOVERY)
    assert woken.message.reason == WakeReason.APPROVAL
    with pytest.raises(InvalidInput) as again:  # the token was the pending one: no longer
        await answer("ap", "tok", actor="alice")
    assert again.value.field == "token"
    assert again.value.problem == "run 'ap' is not waiting for an approval with it"


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_answer_stores_its_decision_in_the_deferred(
    store: Store, queue: AsyncQueue, approved: bool
) -> None:
    """The decision is stored as a boolean in the deferred the run parked on (what its
    body reads on resuming), the same as the journal's record of it."""
    approval = Waiting(WaitingReason.APPROVAL, token=token_hash("tok"))
    await make_parked(store, "ap", approval, deferred="approval")
    answer = queue.approve if approved else queue.deny
    await answer("ap", "tok", {"limit": 5}, actor="alice")
    deferred = await store.deferreds.deferred("ap", "approval")
    assert deferred is not None and isinstance(deferred.value, dict), deferred
    assert deferred.value["approved"] is approved, deferred.value
    assert deferred.value["value"] == {"limit": 5}, deferred.value
    kind = "approval-approved" if approved else "approval-denied"
    assert [r.kind for r in await store.journal.records("ap") if r.kind.startswith("approval")] == [
        kind
    ]


async def _resumed_dead(store: Store, queue: AsyncQueue) -> str:
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    await queue.resume("dead", actor="ops")
    return "dead"


async def _resumed_quarantined(store: Store, queue: AsyncQueue) -> str:
    await make_parked(store, "quarantined", Waiting(WaitingReason.QUARANTINE))
    await queue.resume("quarantined", accept_recorded=True, actor="ops")
    return "quarantined"


async def _completed(store: Store, queue: AsyncQueue) -> str:
    await make_parked(store, "ev", Waiting(WaitingReason.EVENT), deferred="paid")
    assert await queue.complete("ev", "paid", 1)
    return "ev"


async def _approved(store: Store, queue: AsyncQueue) -> str:
    approval = Waiting(WaitingReason.APPROVAL, token=token_hash("tok"))
    await make_parked(store, "ap", approval, deferred="approval")
    await queue.approve("ap", "tok", actor="alice")
    return "ap"


CALLS = {
    "resume dead": (_resumed_dead, WakeReason.RESUME),
    "resume quarantined": (_resumed_quarantined, WakeReason.RESUME),
    "complete": (_completed, WakeReason.EVENT),
    "approve": (_approved, WakeReason.APPROVAL),
}


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_call_that_lets_a_run_go_on_wakes_it_on_the_recovery_lane(
    store: Store, queue: AsyncQueue, call: str
) -> None:
    """Resume (dead or quarantined), complete and approve each wake the run once they
    committed: one wake, on the recovery lane (the run already started), for the run,
    with the call's reason."""
    act, reason = CALLS[call]
    run_id = await act(store, queue)
    (woken,) = await queue.streams.read("c1", [queue.name], count=4, block_ms=0)
    assert (woken.message.run, woken.lane, woken.message.reason) == (
        run_id,
        Lane.RECOVERY,
        reason,
    )


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_a_wake_that_cannot_be_published_is_logged_with_its_run(
    store: Store,
    queue: AsyncQueue,
    call: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The change commits and the call succeeds; the wake's publish fails (injected) and
    is logged naming the run (the lost-wake sweep covers it)."""

    async def refused(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("Redis refused the wake")

    monkeypatch.setattr(queue.streams, "publish", refused)
    caplog.set_level(logging.WARNING, logger="runfleet.producer.queue")
    act, _ = CALLS[call]
    run_id = await act(store, queue)
    (line,) = [r for r in caplog.records if r.getMessage() == "wake.publish_failed"]
    assert line.__dict__["run_id"] == run_id
    assert "Redis refused the wake" in line.__dict__["error"]


async def test_a_resume_without_an_option_is_refused_by_what_the_run_waits_on(
    store: Store, queue: AsyncQueue
) -> None:
    """Without either option only a dead run is resumed: a quarantined run is told to
    choose one, a run waiting on anything else that it is neither; nothing is written."""
    await make_parked(store, "quarantined", Waiting(WaitingReason.QUARANTINE))
    await make_parked(store, "ev", Waiting(WaitingReason.EVENT))
    with pytest.raises(InvalidInput) as choose:
        await queue.resume("quarantined")
    assert (choose.value.field, choose.value.problem) == (
        "resume",
        "run 'quarantined' is quarantined: choose exactly one of accept_recorded or "
        "rerun_step (only a run parked dead is resumed without either)",
    )
    with pytest.raises(InvalidInput) as neither:
        await queue.resume("ev")
    assert (neither.value.field, neither.value.problem) == (
        "run_id",
        "run 'ev' is not quarantined or parked dead",
    )
    for run_id in ("quarantined", "ev"):
        assert (await must_get(store, run_id)).waiting is not None, run_id
        assert "resumed" not in [r.kind for r in await store.journal.records(run_id)]


async def test_a_quarantined_run_given_both_options_is_not_resumed(
    store: Store, queue: AsyncQueue
) -> None:
    """Trusting the record and re-running a step exclude each other: asked both, the
    resume is refused and the quarantine stays."""
    await make_parked(store, "quarantined", Waiting(WaitingReason.QUARANTINE))
    with pytest.raises(InvalidInput) as refused:
        await queue.resume("quarantined", accept_recorded=True, rerun_step="step:a#1")
    assert refused.value.field == "resume", refused.value
    row = await must_get(store, "quarantined")
    assert row.waiting is not None and row.waiting.reason == WaitingReason.QUARANTINE
