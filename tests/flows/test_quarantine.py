"""Quarantine: a recorded output that fails its digest parks the run until an operator decides.

Corrupting a stored row is the one place these tests write behind the code's
back: it stands for disk or operator damage, which no code path produces.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.worker.process import Worker
from tests.flows.conftest import parked


async def _corrupt(settings: Settings, run_id: str, key: str) -> None:
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "UPDATE runfleet.steps SET output = '999'::jsonb WHERE run_id = %s AND key = %s",
            (run_id, key),
        )


async def _quarantined(store: Store, settings: Settings, queue: AsyncQueue) -> str:
    run = await queue.enqueue(f.steps, uuid.uuid4().hex[:6])
    await parked(store, run.id, "event")
    await _corrupt(settings, run.id, "step:a#1")
    await queue.complete(run.id, "go")
    row = await parked(store, run.id, "quarantine")
    assert row.waiting is not None and row.waiting.token == "step:a#1"
    return run.id


async def test_corrupt_record_quarantines_and_no_sweep_wakes_it(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    run_id = await _quarantined(store, settings, queue)
    await asyncio.sleep(settings.sweep_interval * 5)  # several sweep ticks go by
    row = await store.runs.get(run_id)
    assert row is not None and row.waiting is not None and row.waiting.reason == "quarantine"
    assert "quarantined" in [r.kind for r in await store.journal.records(run_id)]


async def test_resume_accepting_the_recorded_output(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    run_id = await _quarantined(store, settings, queue)
    with pytest.raises(InvalidInput):
        await queue.resume(run_id)  # neither choice given
    await queue.resume(run_id, accept_recorded=True, actor="ops")
    result = await queue.run(run_id).result(timeout=10)
    assert result[0] == 999
    resumed = [r for r in await store.journal.records(run_id) if r.kind == "resumed"]
    assert resumed[0].payload["actor"] == "postgres"  # the authenticated role decides
    assert resumed[0].payload["note"] == "ops"


async def test_resume_rerunning_the_step(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    run_id = await _quarantined(store, settings, queue)
    await queue.resume(run_id, rerun_step="step:a#1", actor="ops")
    result = await queue.run(run_id).result(timeout=10)
    assert result[0] == 2  # the step ran a second time (count went 1 -> 2)
