"""Steps: recorded once, replayed by value, retried with a durable attempt counter."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue, RunCancelled, RunFailed
from runfleet.store import Store
from runfleet.store.errors import InvalidInput, UnknownFlow
from runfleet.store.steps import StepState
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.support.polling import until


def tag() -> str:
    return uuid.uuid4().hex[:8]


async def test_recorded_steps_are_never_rerun_and_attempts_survive(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    t = tag()
    run = await queue.enqueue(f.steps, t)
    await parked(store, run.id, "event")
    assert f.CALLS[f"{t}:a"] == 1 and f.CALLS[f"{t}:b"] == 3
    attempts = await store.steps.attempts(run.id, "step:b#1")
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["error"] is None for a in attempts] == [False, False, True]
    await queue.complete(run.id, "go", "now")
    assert await run.result(timeout=10) == [1, f"{t}:b ok", 1]
    # The resume replayed a and b from their records: neither ran again.
    assert f.CALLS[f"{t}:a"] == 1 and f.CALLS[f"{t}:b"] == 3
    records = await store.steps.of_run(run.id)
    assert [r.key for r in records] == ["step:a#1", "step:b#1", "event:go#1", "step:c#1"]


async def test_a_completion_before_the_park_is_not_lost(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    for _ in range(5):
        t = tag()
        run = await queue.enqueue(f.steps, t)
        await queue.complete(run.id, "go", 1)  # usually lands before the body reaches wait_for
        assert (await run.result(timeout=10))[2] == 1


async def test_different_call_at_a_recorded_position_is_nondeterminism(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    flip = tmp_path / "flip"
    run = await queue.enqueue(f.nondeterministic, str(flip))
    await parked(store, run.id, "event")
    flip.write_text("now the body takes the other branch")
    await queue.complete(run.id, "go")
    with pytest.raises(RunFailed) as info:
        await run.result(timeout=10)
    assert info.value.exc_type == "NonDeterminism"
    assert "'step:x#1'" in info.value.exc_message
    assert "'step:y#1'" in info.value.exc_message


async def test_cancel_runs_compensations_in_reverse_once(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    t = tag()
    run = await queue.enqueue(f.compensating, t)
    await parked(store, run.id, "event")
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    assert f.CALLS[f"undo:{t}-1"] == 1 and f.CALLS[f"undo:{t}-2"] == 1
    done = [
        r.payload["key"]
        for r in await store.journal.records(run.id)
        if r.kind == "step-compensated"
    ]
    assert done == ["step:two#1", "step:one#1"]


async def test_shutdown_release_runs_no_compensation(
    settings: object, queue: AsyncQueue, store: Store
) -> None:
    import asyncio

    from runfleet.store.config import Settings

    assert isinstance(settings, Settings)
    w = Worker(settings.model_copy(update={"grace_period": 0.1}), concurrency=2)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(w.started.wait(), 10)
    t = tag()
    run = await queue.enqueue(f.busy_compensating, t)
    await until(lambda: _recorded(store, run.id), 10, "the first step to be recorded")
    w.stop()
    await asyncio.wait_for(task, 15)
    row = await store.runs.get(run.id)
    assert row is not None and row.waiting is not None and row.waiting.reason == "released"
    assert f.CALLS.get(f"undo:{t}-1", 0) == 0


async def _recorded(store: Store, run_id: str) -> bool:
    return bool(await store.steps.of_run(run_id))


async def test_bad_payloads_and_unknown_names_are_refused_at_enqueue(
    queue: AsyncQueue, store: Store
) -> None:
    with pytest.raises(InvalidInput) as info:
        await queue.enqueue(f.steps)  # missing 'tag'
    assert info.value.field == "payload" and "tag" in str(info.value)
    with pytest.raises(InvalidInput):
        await queue.enqueue(f.steps, "x", nonsense=1)
    with pytest.raises(UnknownFlow):
        await queue.enqueue("t.not-a-flow")
    late = AsyncQueue("default", settings=queue.settings, late_binding=True)
    async with late:
        run = await late.enqueue("t.not-a-flow")
    assert (await store.runs.get(run.id)) is not None
    assert await store.stats.status_counts()  # nothing else was half-written


async def test_a_failed_step_is_listed_with_its_error_and_attempts(
    worker: Worker, queue: AsyncQueue
) -> None:
    """DBOS ``list_workflow_steps`` lists a step that raised: so does ``list_steps``."""
    t = tag()
    run = await queue.enqueue(f.failing_step, t)
    with pytest.raises(RunFailed):
        await run.result(timeout=20)
    listed = await queue.list_steps(run.id)
    assert [(s.key, s.state, s.attempts) for s in listed] == [
        ("step:a#1", StepState.COMPLETED, 1),
        ("step:b#1", StepState.FAILED, 2),
    ]
    a, b = listed
    assert (a.name, a.position, a.output, a.error) == ("a", 0, 1, None)
    assert (b.name, b.kind, b.position, b.output) == ("b", "step", None, None)
    assert b.error is not None and f"{t}:b attempt 2" in b.error
