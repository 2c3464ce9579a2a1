"""Faithful replay: a run resumed after a park or a SIGKILL replays its recorded values
exactly (floats stay floats, big ints stay ints) and completes without quarantine.

Before recorded values kept their text, jsonb turned ``1e16`` into an int and ``-0.0``
into ``0.0``; the digest check then parked every such run in quarantine on replay.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

import tests.flows.values_flows as vf
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.errors import ExecutionIdentityConflict
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, records, running_on
from tests.flows.conftest import parked
from tests.store.test_values import identical
from tests.support.polling import until


def _kinds(journal: list[Any]) -> list[str]:
    return [r.kind for r in journal]


async def test_float_step_outputs_replay_without_quarantine(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(vf.replay_after_park)
    await parked(store, run.id, "event")
    event = {"amount": 1e16, "sign": -0.0, "big": 2**64, "ratio": 2.0**60}
    await queue.complete(run.id, "go", event)
    result = await run.result(timeout=15)
    assert identical(result["step"], vf.SPECIALS), result["step"]
    assert result["types"] == vf.types_of(vf.SPECIALS)  # what the flow itself saw on replay
    assert identical(result["event"], event)
    assert identical(await run.return_value(), result)
    row = await store.runs.get(run.id)
    assert row is not None and row.epoch == 2  # resumed once, from the park
    assert "quarantined" not in _kinds(await store.journal.records(run.id))
    (step, wait) = await store.steps.of_run(run.id)
    assert step.intact and wait.intact and identical(step.output, vf.SPECIALS)


async def test_child_results_reach_the_parent_unchanged(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(vf.parent)
    result = await run.result(timeout=15)
    assert identical(result["child"], vf.SPECIALS), result
    assert result["types"] == vf.types_of(vf.SPECIALS)
    assert "quarantined" not in _kinds(await store.journal.records(run.id))


async def test_float_step_outputs_replay_after_sigkill(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    workers = [spawn(flows="tests.flows.values_flows") for _ in range(2)]
    for w in workers:
        await w.wait_started()
    marker = tmp_path / f"held-{uuid.uuid4().hex[:6]}"
    run = await queue.enqueue(vf.replay_after_kill, str(marker))

    async def held() -> Any:
        return marker.exists() and await running_on(store, run.id)

    row = await until(held, 20, "the first execution to record its step and hold")
    assert row.owner is not None
    (victim,) = [w for w in workers if w.pid == row.owner.pid]
    victim.signal(signal.SIGKILL)
    result = await run.result(timeout=30)
    assert identical(result["step"], vf.SPECIALS), result["step"]
    assert result["types"] == vf.types_of(vf.SPECIALS)
    final = await store.runs.get(run.id)
    assert final is not None and final.status is RunStatus.COMPLETED and final.epoch == 2
    assert len(await records(store, run.id, "stolen-and-activated")) == 1
    assert "quarantined" not in _kinds(await store.journal.records(run.id))


async def test_payloads_compare_by_json_value_through_the_queue(queue: AsyncQueue) -> None:
    """Issue 15: re-enqueueing an identical payload joins the run; a different one conflicts."""
    run_id = f"same-{uuid.uuid4().hex[:8]}"
    first = await queue.enqueue(vf.unstorable_result, "big", 2**60, "1e16", run_id=run_id)
    again = await queue.enqueue(vf.unstorable_result, "big", 2**60, "1e16", run_id=run_id)
    assert first.id == again.id == run_id
    floats = f"floats-{uuid.uuid4().hex[:8]}"
    await queue.enqueue(vf.replay_after_kill, [-0.0, 1e16, 2**60, 1.5e300], run_id=floats)
    joined = await queue.enqueue(vf.replay_after_kill, [-0.0, 1e16, 2**60, 1.5e300], run_id=floats)
    assert joined.id == floats
    with pytest.raises(ExecutionIdentityConflict) as caught:
        await queue.enqueue(vf.replay_after_kill, [0.5, 1e16, 2**60, 1.5e300], run_id=floats)
    assert caught.value.field == "payload"


async def test_flow_arguments_arrive_as_the_producer_passed_them(
    worker: Worker, queue: AsyncQueue
) -> None:
    run = await queue.enqueue(vf.echo, list(vf.SPECIALS))
    assert identical(await run.result(timeout=15), vf.SPECIALS)
