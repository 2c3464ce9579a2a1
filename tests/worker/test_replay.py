"""The replay collaborator alone (``worker.authoring.replay.Replay``), and a part built with it.

No driver and no Context: a running row, its owner and epoch, and the store make a
``Replay``; positions, records, the interrupt, the lease gate and parks are checked on it
directly, then a ``Waits`` built with it parks the run on a durable timer.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus, WaitingReason
from runfleet.worker.authoring.durable import Cause, Interrupted, NonDeterminism, Suspended
from runfleet.worker.authoring.replay import Replay
from runfleet.worker.authoring.waits import Waits
from tests.store.helpers import OWNER_A, make_running, must_get


async def test_positions_records_and_replay(store: Store, settings: Settings) -> None:
    row = await make_running(store, "r", OWNER_A)
    first = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
    call = await first.next("step", "a")
    assert (call.position, call.key, call.record) == (0, "step:a#1", None)
    recorded = await first.record(call.position, call.key, "a", "step", {"v": 1})
    assert first.records[0] == recorded and recorded.output == {"v": 1}
    again = await first.next("step", "a")
    assert (again.position, again.key) == (1, "step:a#2"), "the n-th call of a name"

    resumed = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
    resumed.load(await store.steps.of_run("r"))
    assert resumed.peek() == recorded, "peek shows the next record without taking it"
    replayed = await resumed.next("step", "a")
    assert replayed.record == recorded and replayed.position == 0
    with pytest.raises(NonDeterminism):
        other = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
        other.load([recorded])
        await other.next("step", "b")


async def test_the_interrupt_and_the_lease_gate_stop_the_next_call(
    store: Store, settings: Settings
) -> None:
    row = await make_running(store, "r", OWNER_A)
    replay = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
    replay.interrupt(Cause.CANCELLED)
    assert replay.interrupted is Cause.CANCELLED
    with pytest.raises(Interrupted) as info:
        await replay.next("step", "a")
    assert info.value.cause is Cause.CANCELLED
    assert replay.raised_by_runfleet(info.value), "its own stop, by identity"
    assert not replay.raised_by_runfleet(Interrupted(Cause.CANCELLED)), "not a body's own"

    gate = [True]
    gated = Replay(row, OWNER_A, row.epoch, store=store, lease_ok=lambda: gate[0])
    gated.check()
    gate[0] = False
    with pytest.raises(Interrupted):
        gated.check()
    assert gated.interrupted is Cause.LEASE_LAPSED


async def test_a_part_built_with_the_replay_parks_on_a_durable_timer(
    store: Store, settings: Settings
) -> None:
    row = await make_running(store, "r", OWNER_A)
    replay = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
    with pytest.raises(Suspended) as info:
        await Waits(replay).sleep(timedelta(hours=1))
    assert replay.raised_by_runfleet(info.value)
    assert replay.wake_hint is not None, "the driver is told when the timer is due"
    parked = await must_get(store, "r")
    assert parked.status is RunStatus.SUSPENDED and parked.waiting is not None
    assert parked.waiting.reason == WaitingReason.TIMER
    assert [r.key for r in await store.steps.of_run("r")] == ["sleep:sleep#1"]

    fenced = Replay(row, OWNER_A, row.epoch, store=store, settings=settings)
    with pytest.raises(Interrupted) as lost:
        await fenced.ensure_clock("late", parked.now_ms + 1000)  # no longer running here
    assert lost.value.cause is Cause.LOST_FENCE
