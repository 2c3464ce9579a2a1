"""A settling child hands its outcome to every parent and wakes those parked on it.

Includes the interleaving that could lose the wake: a parent parks on its child while
the child's settlement is committed-but-not-yet (the completion was invisible to the park
and the settlement's wake found no parked row), and the race that makes it happen.
"""

from __future__ import annotations

import asyncio
from functools import partial

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    Activated,
    AlreadySatisfied,
    Joined,
    NewRun,
    OnParentExit,
    Parked,
    RunStatus,
    Transitioned,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    OWNER_C,
    create,
    extra_stores,
    lock_waiters,
    make_parked,
    make_running,
    must_get,
    race_pair,
)
from tests.support.polling import until

ITERATIONS = 60


def child_wait(child_id: str) -> Waiting:
    return Waiting(WaitingReason.CHILD, token=child_id)


async def test_settled_child_completes_every_parents_deferred(store: Store) -> None:
    await make_running(store, "p1")
    await make_parked(store, "p2", child_wait("kid"), OWNER_C)
    await make_running(store, "kid", OWNER_B, parent_id="p1")
    await store.dag.record_parent("kid", "p2")
    outcome = await store.lifecycle.transition_owned(
        "kid", OWNER_B, 1, RunStatus.COMPLETED, state_patch={"result": 7}
    )
    assert isinstance(outcome, Transitioned)
    for parent in ("p1", "p2"):
        deferred = await store.deferreds.deferred(parent, "child:kid")
        assert deferred is not None, parent
        assert deferred.value == {
            "status": "completed",
            "result": 7,
            "error": None,
            "handed_off_to": None,
        }
    # p2 was not parked on that deferred (no deferred named at park): still waiting.
    assert (await must_get(store, "p2")).waiting is not None


async def test_settled_child_wakes_the_parent_parked_on_it(store: Store) -> None:
    await make_running(store, "parent")
    await make_running(store, "kid", OWNER_B, parent_id="parent")
    parked = await store.waits.park("parent", OWNER_A, 1, child_wait("kid"), deferred="child:kid")
    assert isinstance(parked, Parked)
    settled = await store.lifecycle.transition_owned("kid", OWNER_B, 1, RunStatus.FAILED)
    assert isinstance(settled, Transitioned) and [r.id for r in settled.woke] == ["parent"]
    parent = await must_get(store, "parent")
    assert parent.status is RunStatus.SUSPENDED and parent.waiting is None
    deferred = await store.deferreds.deferred("parent", "child:kid")
    assert deferred is not None and deferred.value["status"] == "failed"


async def test_a_child_closed_by_a_cascade_notifies_its_other_parents(store: Store) -> None:
    await make_running(store, "doomed")
    await make_running(store, "waiter", OWNER_C)
    await create(store, "shared", parent_id="doomed")
    await store.dag.record_parent("shared", "waiter")
    await store.waits.park("waiter", OWNER_C, 1, child_wait("shared"), deferred="child:shared")
    await store.lifecycle.request_cancel("doomed")
    # The cascade asks; the child's own cancel path closes it and notifies its parents.
    asked = await must_get(store, "shared")
    assert asked.status is RunStatus.PENDING and asked.cancel_requested_at_ms is not None
    activated = await store.runs.claim_and_activate("shared", asked.snapshot, OWNER_A)
    assert isinstance(activated, Activated)
    await store.lifecycle.acknowledge_cancel("shared", OWNER_A, activated.row.epoch)
    assert (await must_get(store, "shared")).status is RunStatus.CANCELLED
    waiter = await must_get(store, "waiter")
    assert waiter.waiting is None, "the diamond parent must be woken"
    deferred = await store.deferreds.deferred("waiter", "child:shared")
    assert deferred is not None and deferred.value["status"] == "cancelled"


async def test_detached_child_settling_still_notifies_its_parent(store: Store) -> None:
    await make_running(store, "parent")
    await make_running(
        store, "kid", OWNER_B, parent_id="parent", on_parent_exit=OnParentExit.DETACH
    )
    await store.lifecycle.transition_owned("kid", OWNER_B, 1, RunStatus.COMPLETED)
    assert await store.deferreds.deferred("parent", "child:kid") is not None


async def test_park_waits_for_a_child_settlement_in_flight(
    settings: Settings, store: Store
) -> None:
    """The settlement has run but not committed when the parent parks on it."""
    await make_running(store, "parent")
    await make_running(store, "kid", OWNER_B, parent_id="parent")
    async with extra_stores(settings, 1) as (child_side,):
        settling = asyncio.Event()
        may_commit = asyncio.Event()

        async def settle() -> None:
            async with child_side.transaction():
                done = await child_side.lifecycle.transition_owned(
                    "kid", OWNER_B, 1, RunStatus.COMPLETED, state_patch={"result": "r"}
                )
                assert isinstance(done, Transitioned)
                settling.set()
                await may_commit.wait()

        settler = asyncio.ensure_future(settle())
        try:
            await settling.wait()
            park = asyncio.ensure_future(
                store.waits.park("parent", OWNER_A, 1, child_wait("kid"), deferred="child:kid")
            )
            # The park must not decide while the settlement is in flight.
            await until(
                partial(lock_waiters, settings.database_url),
                10.0,
                "the park to wait for the child's settlement",
                accept=lambda n: n >= 1 or park.done(),
                every=0.002,
            )
            assert not park.done(), f"decided too early: {park.result()!r}"
        finally:
            may_commit.set()  # never leave the settlement's transaction open
            await settler
        outcome = await park
    assert outcome == AlreadySatisfied("child:kid")
    parent = await must_get(store, "parent")
    assert parent.status is RunStatus.RUNNING and parent.waiting is None


async def test_race_child_settlement_against_parent_park_is_never_lost(
    settings: Settings, store: Store
) -> None:
    """Free-running (the interleavings are pinned down by the tests above): never lost."""
    async with extra_stores(settings, 2) as (parent_side, child_side):
        for i in range(ITERATIONS):
            parent_id, kid_id = f"parent-{i}", f"kid-{i}"
            await make_running(store, parent_id)
            await make_running(store, kid_id, OWNER_B, parent_id=parent_id)
            parked, settled = await race_pair(
                partial(
                    parent_side.waits.park,
                    parent_id,
                    OWNER_A,
                    1,
                    child_wait(kid_id),
                    deferred=f"child:{kid_id}",
                ),
                partial(
                    child_side.lifecycle.transition_owned,
                    kid_id,
                    OWNER_B,
                    1,
                    RunStatus.COMPLETED,
                ),
                second_starts_first=i % 2 == 1,
            )
            assert isinstance(settled, Transitioned), settled
            parent = await must_get(store, parent_id)
            assert parent.waiting is None, f"wake lost: {parked!r}"
            assert await store.deferreds.deferred(parent_id, f"child:{kid_id}") is not None
            if isinstance(parked, AlreadySatisfied):
                assert parent.status is RunStatus.RUNNING
            else:
                assert isinstance(parked, Parked), parked
                assert parent.status is RunStatus.SUSPENDED


async def test_a_join_waits_for_a_child_settlement_in_flight(
    settings: Settings, store: Store
) -> None:
    """A diamond's second parent joins while the child's settlement is uncommitted: the
    settlement handed its outcome to the parents it saw, so the join must see it settled."""
    await make_running(store, "first")
    await make_running(store, "second", OWNER_C)
    await make_running(store, "kid", OWNER_B, parent_id="first")
    async with extra_stores(settings, 1) as (child_side,):
        settling = asyncio.Event()
        may_commit = asyncio.Event()

        async def settle() -> None:
            async with child_side.transaction():
                done = await child_side.lifecycle.transition_owned(
                    "kid", OWNER_B, 1, RunStatus.COMPLETED, state_patch={"result": "r"}
                )
                assert isinstance(done, Transitioned)
                settling.set()
                await may_commit.wait()

        settler = asyncio.ensure_future(settle())
        try:
            await settling.wait()
            join = asyncio.ensure_future(
                store.admission.create(NewRun(id="kid", flow="tests.flow", parent_id="second"))
            )
            await until(
                partial(lock_waiters, settings.database_url),
                10.0,
                "the join to wait for the child's settlement",
                accept=lambda n: n >= 1 or join.done(),
                every=0.002,
            )
            assert not join.done(), f"decided too early: {join.result()!r}"
        finally:
            may_commit.set()  # never leave the settlement's transaction open
            await settler
        assert isinstance(await join, Joined)
    done = await store.deferreds.deferred("second", "child:kid")
    assert done is not None and done.value["result"] == "r"


async def test_race_child_settlement_against_a_second_parent_joining_is_never_lost(
    settings: Settings, store: Store
) -> None:
    async with extra_stores(settings, 2) as (parent_side, child_side):
        for i in range(ITERATIONS // 2):
            first, second, kid_id = f"first-{i}", f"second-{i}", f"kid-{i}"
            await make_running(store, first)
            await make_running(store, second, OWNER_C)
            await make_running(store, kid_id, OWNER_B, parent_id=first)
            joined, settled = await race_pair(
                partial(
                    parent_side.admission.create,
                    NewRun(id=kid_id, flow="tests.flow", parent_id=second),
                ),
                partial(
                    child_side.lifecycle.transition_owned,
                    kid_id,
                    OWNER_B,
                    1,
                    RunStatus.COMPLETED,
                ),
                second_starts_first=i % 2 == 1,
            )
            assert isinstance(joined, Joined), joined
            assert isinstance(settled, Transitioned), settled
            for parent in (first, second):
                got = await store.deferreds.deferred(parent, f"child:{kid_id}")
                assert got is not None, f"{parent} never got the outcome of {kid_id}"
