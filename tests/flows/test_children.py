"""Children (attached and detached), cascades, handoff rounds, waiting trees."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue, RunCancelled, RunFailed
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import NewRun, OnParentExit, RunStatus, WaitingReason
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.support.polling import until


async def _children(store: Store, run_id: str) -> dict[str, OnParentExit]:
    out = {}
    for edge in await store.dag.children(run_id):
        row = await store.runs.get(edge.child_id)
        assert row is not None
        out[row.id] = row.on_parent_exit
    return out


async def test_attached_child_is_awaited_and_detached_outlives(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.parent, 21)
    await parked(store, run.id, "child")
    kids = await _children(store, run.id)
    (attached,) = [k for k, p in kids.items() if p is OnParentExit.CANCEL]
    (detached,) = [k for k, p in kids.items() if p is OnParentExit.DETACH]
    await parked(store, attached, "event")
    tree = await store.waits.waiting_tree(run.id)
    assert [w.run_id for w in tree] == [run.id, attached]  # the detached one is skipped
    everything = await store.waits.waiting_tree(run.id, include_detached=True)
    assert {w.run_id for w in everything} == {run.id, attached, detached}
    await queue.complete(attached, "release")
    assert await run.result(timeout=10) == {"doubled": 42, "spawned": detached}
    row = await store.runs.get(detached)
    assert row is not None and not row.status.terminal  # detached: left running on its own


async def test_cancelling_a_parent_cascades_to_attached_children_only(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.parent, 1)
    await parked(store, run.id, "child")
    kids = await _children(store, run.id)
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    for kid, policy in kids.items():
        if policy is OnParentExit.CANCEL:  # asked by the cascade, closed by its own cancel path
            with pytest.raises(RunCancelled):
                await queue.run(kid).result(timeout=10)
        row = await store.runs.get(kid)
        assert row is not None
        assert (row.status is RunStatus.CANCELLED) == (policy is OnParentExit.CANCEL)


async def test_a_failed_child_fails_the_awaiting_parent(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.parent, 2)
    await parked(store, run.id, "child")
    attached = next(
        k for k, p in (await _children(store, run.id)).items() if p is OnParentExit.CANCEL
    )
    await queue.cancel(attached)
    with pytest.raises(RunFailed) as info:
        await run.result(timeout=10)
    assert info.value.exc_type == "ChildFailed"


async def test_a_second_parent_joining_a_finished_child_gets_its_result_at_once(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    first = await queue.enqueue(f.joiner, "shared-kid")
    assert await first.result(timeout=10) == "done"  # the child handed off once, then ended
    kid = await store.runs.get("shared-kid")
    assert kid is not None and kid.status is RunStatus.COMPLETED
    second = await queue.enqueue(f.joiner, "shared-kid")  # same child id, same arguments
    assert await second.result(timeout=10) == "done", "the late parent is never woken"
    assert [e.parent_id for e in await store.dag.parents("shared-kid")] == [first.id, second.id]


async def test_a_child_gets_its_own_flows_deadline(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.awaits_timed_child)
    assert await run.result(timeout=10) == "child cancelled"
    (kid,) = await _children(store, run.id)
    row = await store.runs.get(kid)
    assert row is not None and row.status is RunStatus.CANCELLED
    assert row.deadline_ms == row.created_at_ms + 500
    asked = [r for r in await store.journal.records(kid) if r.kind == "cancel-requested"]
    assert asked[0].payload["note"] == "deadline"


async def test_an_attached_child_never_outlives_its_parents_deadline(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.timed_parent)
    await parked(store, run.id, "child")
    parent = await store.runs.get(run.id)
    assert parent is not None and parent.deadline_ms is not None
    children = await _children(store, run.id)
    for kid, policy in children.items():
        row = await store.runs.get(kid)
        assert row is not None
        if policy is OnParentExit.CANCEL:
            assert row.deadline_ms == parent.deadline_ms, "cut to the parent's deadline"
        else:
            assert row.deadline_ms is None, "a detached child keeps its own (none)"
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    for kid, policy in children.items():
        if policy is OnParentExit.CANCEL:
            await until(partial(_settled, store, kid), 10, f"{kid} to end")
        else:
            spawned = await store.runs.get(kid)
            assert spawned is not None and not spawned.status.terminal


async def test_handoff_rounds_and_result_follows_the_lineage(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(f.rounds, 2)
    assert await run.result(timeout=10) == "done"
    last = await store.runs.latest_round(run.id)
    assert last is not None and last.round_ordinal == 2 and last.id == f"{run.id}@2"
    assert last.parent_run_id == f"{run.id}@1"
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert "handed-off" in kinds


async def test_max_rounds_exhausted_fails_the_round(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(f.rounds, 5)
    with pytest.raises(RunFailed) as info:
        await run.result(timeout=10)
    assert info.value.exc_type == "LineageExhausted"


@pytest.mark.parametrize("parent_first", [True, False])
async def test_child_admitted_around_a_parent_cancel_inherits_it(
    settings: Settings, store: Store, parent_first: bool
) -> None:
    other = await Store.open(settings)
    try:
        for i in range(20):
            parent = f"p-{parent_first}-{i}"
            await store.admission.create(NewRun(id=parent, flow="t.leaf"))
            child = NewRun(id=f"{parent}/c", flow="t.leaf", parent_id=parent)
            if parent_first:
                await store.lifecycle.request_cancel(parent)
                await other.admission.create(child)
            else:
                await asyncio.gather(
                    store.lifecycle.request_cancel(parent), other.admission.create(child)
                )
            row = await store.runs.get(child.id)
            assert row is not None
            assert row.cancel_requested_at_ms is not None or row.status is RunStatus.CANCELLED
    finally:
        await other.close()


async def test_a_child_of_a_finished_parent_is_born_cancelled(store: Store) -> None:
    from runfleet.store.types import Owner

    me = Owner("h", 1, "n")
    created = await store.admission.create(NewRun(id="done-parent", flow="t.leaf"))
    activated = await store.runs.claim_and_activate("done-parent", created.row.snapshot, me)
    assert hasattr(activated, "row")
    await store.lifecycle.transition_owned("done-parent", me, 1, RunStatus.COMPLETED)
    await store.admission.create(NewRun(id="late-child", flow="t.leaf", parent_id="done-parent"))
    row = await store.runs.get("late-child")
    assert row is not None and row.cancel_requested_at_ms is not None


async def test_a_settled_child_wakes_every_waiting_parent(store: Store) -> None:
    """Diamond: one child, two parents parked on it; its settlement wakes both."""
    from runfleet.store.types import Owner, Waiting

    me = Owner("h", 1, "n")
    for p in ("left", "right"):
        created = await store.admission.create(NewRun(id=p, flow="t.leaf"))
        await store.runs.claim_and_activate(p, created.row.snapshot, me)
    child = await store.admission.create(NewRun(id="shared", flow="t.leaf", parent_id="left"))
    await store.dag.record_parent("shared", "right")
    for p in ("left", "right"):
        await store.waits.park(
            p, me, 1, Waiting(reason=WaitingReason.CHILD, token="shared"), deferred="child:shared"
        )
    await store.runs.claim_and_activate("shared", child.row.snapshot, me)
    await store.lifecycle.transition_owned(
        "shared", me, 1, RunStatus.COMPLETED, state_patch={"result": 7}
    )
    for p in ("left", "right"):
        row = await store.runs.get(p)
        assert row is not None and row.waiting is None
        done = await store.deferreds.deferred(p, "child:shared")
        assert done is not None and done.value["result"] == 7


async def test_scopes_are_inherited_and_enforced(
    worker: Worker, settings: Settings, store: Store
) -> None:
    from runfleet.store.errors import ScopeDenied

    async with (
        AsyncQueue("default", settings=settings, scopes=["tenant-a"]) as tenant,
        AsyncQueue("default", settings=settings, scopes=["tenant-b"]) as stranger,
    ):
        run = await tenant.enqueue(f.parent, 3)
        await parked(store, run.id, "child")
        for kid in await _children(store, run.id):
            row = await store.runs.get(kid)
            assert row is not None and row.scopes == ("tenant-a",)
        with pytest.raises(ScopeDenied):
            await stranger.run(run.id).get_status()
        with pytest.raises(ScopeDenied):
            await stranger.cancel(run.id)
        with pytest.raises(ScopeDenied):
            await stranger.complete(run.id, "release")
        await tenant.cancel(run.id)
        with pytest.raises(RunCancelled):
            await tenant.run(run.id).result(timeout=10)
    await until(lambda: _settled(store, run.id), 5, "cancel to settle")


async def _settled(store: Store, run_id: str) -> bool:
    row = await store.runs.get(run_id)
    return row is not None and row.status.terminal
