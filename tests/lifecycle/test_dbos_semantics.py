"""What a DBOS user's code expects of a run (docs/how-to/moving-from-dbos.md), against real
Postgres and Redis: a run parked dead answers at once, resume keeps the id the user holds,
unknown ids answer None or nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, RunDead, RunFailed
from runfleet.rqface import JobStatus, Queue
from runfleet.store import Kind, Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.types import DeadLettered
from tests.fleet.procs import records
from tests.store.helpers import OWNER_B, extra_stores, make_running, wait_db_time_past


async def _dead(settings: Settings, store: Store, run_id: str) -> None:
    """Park ``run_id`` dead as a fleet does: its owner is lost and, with no recovery
    allowed, the first steal buries it (``RUNFLEET_MAX_RECOVERIES=0``)."""
    no_recovery = settings.model_copy(update={"max_recoveries": 0})
    async with extra_stores(no_recovery, 1) as (thief,):
        row = await make_running(thief, run_id, flow="tests.lifecycle.poison")
        assert row.heartbeat_at_ms is not None
        await wait_db_time_past(store, row.heartbeat_at_ms)
        evidence = jr.ProbeEvidence(probe="same-host-pid-dead", observer=OWNER_B.key)
        buried = await thief.runs.steal(run_id, row.snapshot, OWNER_B, evidence, stale_after_ms=0)
    assert isinstance(buried, DeadLettered), buried


async def test_awaiting_a_dead_run_raises_at_once_and_its_status_reads_dead(
    settings: Settings, store: Store, queue: AsyncQueue
) -> None:
    await _dead(settings, store, "poison")
    started = time.monotonic()
    with pytest.raises(RunDead) as caught:
        await queue.run("poison").result(timeout=30)
    assert time.monotonic() - started < 5, "waited for a run nothing will move"
    assert isinstance(caught.value, RunFailed) and caught.value.run_id == "poison"
    assert caught.value.error is None, "a dead run raised nothing"
    evidence = caught.value.evidence
    assert isinstance(evidence, dict) and evidence["recoveries"] == 0

    def sync_side() -> JobStatus:
        with Queue("default", settings=settings) as q:
            job = q.fetch_job("poison")
            assert job is not None
            with pytest.raises(RunDead):
                job.wait(timeout=30)
            return job.get_status()

    assert await asyncio.to_thread(sync_side) is JobStatus.DEAD


async def test_resume_run_moves_a_dead_run_on_in_place_and_twice_is_harmless(
    settings: Settings, store: Store, queue: AsyncQueue
) -> None:
    await _dead(settings, store, "poison-2")
    resumed = await queue.resume_run("poison-2")
    assert resumed.id == "poison-2"
    row = await store.runs.get("poison-2")
    assert row is not None and row.waiting is None and row.recoveries == 0
    again = await queue.resume_run("poison-2")  # open now: nothing to resume
    assert again.id == "poison-2"
    assert len(await records(store, "poison-2", Kind.RESUMED)) == 1


async def test_queue_limits_from_python_and_priority_and_dedup_read_back(
    settings: Settings, store: Store, queue: AsyncQueue
) -> None:
    configured = await queue.configure(concurrency=2, rate=5, note="from python")
    assert (configured.concurrency, configured.rate_per_s) == (2, 5)
    (change, *_) = await store.queues.changes("default")
    assert change.change == {"concurrency": 2, "rate_per_s": 5} and change.note == "from python"
    lifted = await queue.configure(concurrency=0)
    assert (lifted.concurrency, lifted.rate_per_s) == (None, 5)

    run = await queue.enqueue(qf.nap, 1, priority=3, dedup_key="order-9")
    assert await run.get_priority() == 3
    assert await run.get_dedup_key() == "order-9"

    def sync_side() -> tuple[int, str | None, float | None]:
        with Queue("default", settings=settings) as q:
            job = q.fetch_job(run.id)
            assert job is not None
            return job.priority, job.dedup_key, q.configure(rate=0).rate_per_s

    assert await asyncio.to_thread(sync_side) == (3, "order-9", None)
