"""Seed rules about the run DAG: cascades, late children, diamonds, late completions.

Real Postgres; each test is named after the rule it proves.
"""

from __future__ import annotations

import psycopg
import pytest

from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.errors import CancelRequestFailed, FlowCycleDetected
from runfleet.store.types import (
    AlreadySatisfied,
    AlreadyTerminal,
    CancelRequested,
    Joined,
    NewRun,
    OnParentExit,
    Parked,
    RunStatus,
    Transitioned,
    Waiting,
    WaitingReason,
)
from runfleet.worker.authoring.durable import Handoff
from tests.seed_rules import flows as sr
from tests.seed_rules.test_lineage import handed_off
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    OWNER_C,
    activate,
    create,
    journal_kinds,
    make_running,
    must_get,
)


async def test_the_cascade_has_no_arbitrary_depth_cap(store: Store) -> None:
    await create(store, "c0")
    for depth in range(1, 81):  # deeper than 64, a depth a capped walk would stop at
        await create(store, f"c{depth}", parent_id=f"c{depth - 1}")
    outcome = await store.lifecycle.request_cancel("c0")
    assert isinstance(outcome, CancelRequested)
    assert len(outcome.cascaded) == 80
    deepest = await must_get(store, "c80")
    assert deepest.cancel_requested_at_ms is not None
    assert deepest.status is RunStatus.PENDING  # asked; its own cancel path closes it


async def test_a_late_child_inherits_a_cancel_from_any_round_with_the_parents_timestamp(
    store: Store,
) -> None:
    root = await make_running(store, "P", flow="sr.lineage")
    live = await handed_off(store, root, Handoff(sr.lineage, (0,)))  # P completed, P@1 live
    # A child admitted under the handed-off round while P@1 lives is NOT ended: the lineage
    # (its parent) carries on, although round P itself is `completed`.
    spared = await create(store, "spared", parent_id="P")
    assert spared.cancel_requested_at_ms is None
    asked = await store.lifecycle.request_cancel(live.id)
    assert isinstance(asked, CancelRequested)
    parent_at = (await must_get(store, live.id)).cancel_requested_at_ms
    late = await create(store, "late", parent_id="P")  # round P is not the cancelled one
    assert late.cancel_requested_at_ms == parent_at, "the parent's own request timestamp"
    assert (await store.journal.records("late"))[0].payload["inherited_cancel"] is True


async def test_a_settled_child_wakes_the_parents_of_every_round(store: Store) -> None:
    await make_running(store, "P1")
    await make_running(store, "P2", OWNER_C)
    await create(store, "C", flow="sr.lineage", parent_id="P1")
    joined = await store.admission.create(NewRun(id="C", flow="sr.lineage", parent_id="P2"))
    assert isinstance(joined, Joined)
    child = await activate(store, "C", OWNER_A)
    last = await handed_off(store, child, Handoff(sr.lineage, (0,)))  # C@1: edge to P1 only
    assert [e.parent_id for e in await store.dag.parents(last.id)] == ["P1"]
    # P2 followed the handoff (deferred child:C said handed_off_to C@1) and parks on C@1.
    parked = await store.waits.park(
        "P2", OWNER_C, 1, Waiting(WaitingReason.CHILD, token=last.id), deferred=f"child:{last.id}"
    )
    assert isinstance(parked, Parked), parked
    done = await store.lifecycle.transition_owned(
        last.id, OWNER_A, last.epoch, RunStatus.COMPLETED, state_patch={"result": 7}
    )
    assert isinstance(done, Transitioned) and "P2" in [r.id for r in done.woke]
    p2 = await must_get(store, "P2")
    assert p2.waiting is None, "the second parent of round 0 is woken by round 1"
    deferred = await store.deferreds.deferred("P2", f"child:{last.id}")
    assert deferred is not None and deferred.value["result"] == 7


async def test_a_diamonds_second_parent_gets_an_edge_on_join(store: Store) -> None:
    await create(store, "R")
    await make_running(store, "P1", parent_id="R")
    await make_running(store, "P2", OWNER_C, parent_id="R")
    await create(store, "D", payload={"n": 1}, parent_id="P1")
    joined = await store.admission.create(
        NewRun(id="D", flow="tests.flow", payload={"n": 1}, parent_id="P2")
    )
    assert isinstance(joined, Joined), joined
    assert [e.parent_id for e in await store.dag.parents("D")] == ["P1", "P2"]
    # Joining again is idempotent; a join that would close a cycle leaves no trace.
    assert isinstance(
        await store.admission.create(
            NewRun(id="D", flow="tests.flow", payload={"n": 1}, parent_id="P2")
        ),
        Joined,
    )
    await create(store, "G", parent_id="D")
    with pytest.raises(FlowCycleDetected):
        await store.admission.create(NewRun(id="P1", flow="tests.flow", parent_id="G"))
    assert [e.parent_id for e in await store.dag.parents("D")] == ["P1", "P2"]
    assert [e.parent_id for e in await store.dag.parents("P1")] == ["R"]


async def test_a_parent_joining_an_already_settled_child_gets_its_outcome_at_once(
    store: Store,
) -> None:
    await make_running(store, "P1")
    await make_running(store, "P2", OWNER_C)
    await create(store, "D", payload={"n": 1}, parent_id="P1")
    child = await activate(store, "D", OWNER_A)
    await store.lifecycle.transition_owned(
        "D", OWNER_A, child.epoch, RunStatus.COMPLETED, state_patch={"result": 7.0}
    )
    joined = await store.admission.create(
        NewRun(id="D", flow="tests.flow", payload={"n": 1}, parent_id="P2")
    )
    assert isinstance(joined, Joined), joined
    done = await store.deferreds.deferred("P2", "child:D")
    assert done is not None, "the joining parent is handed the settled child's outcome"
    assert done.value == {
        "status": "completed",
        "result": 7.0,
        "error": None,
        "handed_off_to": None,
    }
    assert isinstance(done.value["result"], float)
    parked = await store.waits.park(
        "P2", OWNER_C, 1, Waiting(WaitingReason.CHILD, token="D"), deferred="child:D"
    )
    assert isinstance(parked, AlreadySatisfied), "it never parks on a wake already sent"


async def test_a_parent_joining_a_handed_off_child_gets_every_settled_round(
    store: Store,
) -> None:
    await make_running(store, "P1")
    await make_running(store, "P2", OWNER_C)
    await create(store, "C", flow="sr.lineage", parent_id="P1")
    child = await activate(store, "C", OWNER_A)
    last = await handed_off(store, child, Handoff(sr.lineage, (0,)))  # C completed, C@1 live
    await store.lifecycle.transition_owned(
        last.id, OWNER_A, last.epoch, RunStatus.COMPLETED, state_patch={"result": "end"}
    )
    joined = await store.admission.create(NewRun(id="C", flow="sr.lineage", parent_id="P2"))
    assert isinstance(joined, Joined), joined
    first = await store.deferreds.deferred("P2", "child:C")
    assert first is not None and first.value["handed_off_to"] == last.id
    followed = await store.deferreds.deferred("P2", f"child:{last.id}")
    assert followed is not None and followed.value["result"] == "end"


async def test_a_parent_parked_on_a_child_it_joins_after_settlement_is_woken(
    store: Store,
) -> None:
    """A join from outside the parent's body (the parent parked): its wait is cleared."""
    await make_running(store, "P1")
    await create(store, "D", parent_id="P1")
    child = await activate(store, "D", OWNER_B)
    await store.lifecycle.transition_owned("D", OWNER_B, child.epoch, RunStatus.FAILED)
    await make_running(store, "P2", OWNER_C)
    await store.waits.park(
        "P2", OWNER_C, 1, Waiting(WaitingReason.CHILD, token="D"), deferred="child:D"
    )
    assert isinstance(
        await store.admission.create(NewRun(id="D", flow="tests.flow", parent_id="P2")), Joined
    )
    p2 = await must_get(store, "P2")
    assert p2.status is RunStatus.SUSPENDED and p2.waiting is None, "woken: a claim resumes it"
    done = await store.deferreds.deferred("P2", "child:D")
    assert done is not None and done.value["status"] == "failed"


async def test_a_diamonds_second_parent_cancelled_is_inherited_on_join(store: Store) -> None:
    await make_running(store, "P1")
    await make_running(store, "P2", OWNER_C)
    await create(store, "D", parent_id="P1")
    await store.lifecycle.request_cancel("P2")
    at = (await must_get(store, "P2")).cancel_requested_at_ms
    joined = await store.admission.create(NewRun(id="D", flow="tests.flow", parent_id="P2"))
    assert isinstance(joined, Joined)
    assert (await must_get(store, "D")).cancel_requested_at_ms == at


async def test_a_settled_run_gets_no_wake_and_no_receipt_for_a_late_completion(
    store: Store,
) -> None:
    run = await make_running(store, "r")
    await store.lifecycle.transition_owned("r", OWNER_A, run.epoch, RunStatus.COMPLETED)
    before = await journal_kinds(store, "r")
    late = await store.deferreds.complete_deferred("r", "go", {"late": True})
    assert isinstance(late.outcome, AlreadyTerminal) and late.woke is False
    assert await store.deferreds.deferred("r", "go") is None
    assert await journal_kinds(store, "r") == before, "no receipt journaled"


async def test_a_settled_parent_takes_no_child_deferred(store: Store) -> None:
    """A child settling after its parent settled writes nothing onto the parent."""
    parent = await make_running(store, "P")
    await create(store, "attached", parent_id="P")
    await create(store, "detached", parent_id="P", on_parent_exit=OnParentExit.DETACH)
    await make_running(store, "live")  # a second parent of `attached`, still running
    await store.dag.record_parent("attached", "live")
    await store.lifecycle.transition_owned("P", OWNER_A, parent.epoch, RunStatus.COMPLETED)
    kept = await journal_kinds(store, "P")
    for kid, status in (("attached", RunStatus.CANCELLED), ("detached", RunStatus.COMPLETED)):
        row = await activate(store, kid, OWNER_C)
        done = await store.lifecycle.transition_owned(
            kid, OWNER_C, row.epoch, status, guard=False, state_patch={"result": kid}
        )
        assert isinstance(done, Transitioned), done
        assert await store.deferreds.deferred("P", f"child:{kid}") is None, kid
    assert await store.deferreds.completed_deferreds("P") == []
    assert await journal_kinds(store, "P") == kept
    live = await store.deferreds.deferred("live", "child:attached")
    assert live is not None and live.value["status"] == "cancelled", "a live parent still does"


async def test_a_failed_cancel_write_is_a_typed_retryable_cancel_request_failed(
    store: Store, queue: AsyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write's failure is injected (a driver error that is no outage); the real
    retry path for outages ends in Unavailable, which is translated the same way."""
    await create(store, "r")
    real = queue.store.lifecycle.request_cancel

    async def broken(run_id: str, **kwargs: object) -> object:
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(queue.store.lifecycle, "request_cancel", broken)
    with pytest.raises(CancelRequestFailed) as info:
        await queue.cancel("r")
    assert info.value.code == "cancel_request_failed" and info.value.retryable is True
    assert (await must_get(store, "r")).cancel_requested_at_ms is None  # nothing recorded
    monkeypatch.setattr(queue.store.lifecycle, "request_cancel", real)
    assert isinstance(await queue.cancel("r"), CancelRequested)  # asking again works


async def test_a_cancel_write_failing_with_a_driver_error_is_no_untyped_error(
    store: Store, queue: AsyncQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver error that is no outage (injected: data the server refuses) is not retried
    and never becomes ``Unavailable``: it reaches the caller as CancelRequestFailed, not as
    the raw psycopg error, marked not retryable (it would fail the same way), and nothing
    was recorded."""
    await create(store, "r")
    real = queue.store.lifecycle.request_cancel
    calls: list[str] = []

    async def refused(run_id: str, **kwargs: object) -> object:
        calls.append(run_id)
        raise psycopg.errors.DataError("invalid input syntax")

    monkeypatch.setattr(queue.store.lifecycle, "request_cancel", refused)
    with pytest.raises(CancelRequestFailed) as info:
        await queue.cancel("r")
    assert info.value.code == "cancel_request_failed" and info.value.retryable is False
    assert info.value.run_id == "r" and "invalid input syntax" in info.value.reason
    assert isinstance(info.value.__cause__, psycopg.errors.DataError)
    assert calls == ["r"], "not retried: it is no outage"
    assert (await must_get(store, "r")).cancel_requested_at_ms is None  # nothing recorded
    monkeypatch.setattr(queue.store.lifecycle, "request_cancel", real)
    assert isinstance(await queue.cancel("r"), CancelRequested)
