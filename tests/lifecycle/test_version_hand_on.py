"""A rolling deploy does not stall new runs: a worker of the wrong version hands the
wake on (``worker.hand_on``), so a worker of the run's version takes it in seconds, not
at the lost-wake sweep; and workers of the wrong version cannot pass it between them at
full speed."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

import tests.lifecycle.versions_v2 as v2
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunRow, RunStatus
from runfleet.worker import hand_on
from runfleet.worker.hand_on import HandOn
from tests.fleet.procs import Spawn
from tests.support.polling import until

V1, V2 = "tests.lifecycle.versions_v1", "tests.lifecycle.versions_v2"


@pytest.mark.chaos
async def test_a_v2_run_whose_wake_reached_a_v1_worker_starts_on_a_v2_worker_at_once(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    a = spawn(flows=V1, **PRODUCTION_TIMING)
    b = spawn(flows=V2, **PRODUCTION_TIMING)
    await a.wait_started()
    await b.wait_started()
    b.signal(signal.SIGSTOP)  # both live, and the wake can only reach the v1 worker
    try:
        run = await queue.enqueue(v2.strict)
        await until(lambda: _logged(a.log(), "run.version_not_carried"), 30, "A to read it")
    finally:
        b.signal(signal.SIGCONT)
    started = time.monotonic()
    assert await run.result(timeout=MAX_WAIT_S) == -b.pid
    waited = time.monotonic() - started
    # within seconds of the v2 worker reading again (the lost-wake sweep took 44-56 s)
    assert waited < MAX_WAIT_S, f"the v2 run waited {waited:.1f} s for the v2 worker"
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.COMPLETED and row.epoch == 1
    assert "run.version_handed_on" in a.log()


MAX_WAIT_S = 10.0
PRODUCTION_TIMING = {
    name: Settings.model_fields[name].default
    for name in ("heartbeat_interval", "stale_after", "sweep_interval")
}
"""The workers' sweeps at their shipped pace (the suite's are five times faster), so the
lost-wake sweep cannot stand in for the hand-on."""


async def _logged(log: str, event: str) -> bool:
    return event in log


def _row(run_id: str, status: RunStatus = RunStatus.PENDING) -> RunRow:
    return RunRow(
        id=run_id,
        flow="lifecycle.strict",
        queue="default",
        status=status,
        state={"flow_version": "v2"},
        owner=None,
        epoch=0,
        heartbeat_at_ms=None,
        claim=None,
        claimed_at_ms=None,
        cancel_requested_at_ms=None,
        lineage_id=run_id,
        round_ordinal=0,
        parent_run_id=None,
        created_at_ms=0,
        updated_at_ms=0,
        waiting=None,
    )


async def test_one_run_is_handed_on_at_once_then_ever_more_slowly_never_twice_at_a_time() -> None:
    sent: list[float] = []
    began = time.monotonic()

    async def hint(row: RunRow) -> None:
        sent.append(time.monotonic() - began)

    handing = HandOn(hint)
    row = _row("r1")
    for _ in range(50):  # fifty wakes at full speed while one hand-on is due: one sent
        handing.wake(row, ["v1"])
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(sent) == 1 and sent[0] < 0.05, "the first hand-on goes out at once"
    for _ in range(4):  # each wake coming back after its hand-on: the next waits longer
        handing.wake(row, ["v1"])
        await asyncio.sleep(0.5)
    assert len(sent) == 5
    assert sent[1] - sent[0] >= hand_on.FIRST_DELAY_S
    assert [handing.delay(n) for n in range(8)] == [0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    handing.wake(_row("waiting", RunStatus.RUNNING), ["v1"])  # not ready to claim: kept
    await asyncio.sleep(0.01)
    assert len(sent) == 5
    handing.close()


async def test_hand_ons_of_many_runs_are_bounded_per_second() -> None:
    """A backlog of runs of a version no live worker carries: a bounded trickle of wakes
    from each process, the rest left to the lost-wake sweep."""
    sent: list[str] = []

    async def hint(row: RunRow) -> None:
        sent.append(row.id)

    handing = HandOn(hint)
    for i in range(5 * hand_on.PER_SECOND):
        handing.wake(_row(f"r{i}"), ["v1"])
    await asyncio.sleep(0.01)
    assert hand_on.PER_SECOND <= len(sent) <= hand_on.PER_SECOND + 2
    handing.close()
