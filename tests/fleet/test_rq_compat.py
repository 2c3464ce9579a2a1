"""The same producer code against real rq and against runfleet: only setup differs.

``produce`` is what an rq user's web app does. It runs unchanged on an
``rq.Queue`` (executed by rq's SimpleWorker) and on a ``rqface.Queue``
(executed by a runfleet worker): moving is an import and a URL. The corpus of rq's
documented patterns, each asserted to answer the same on both, is tests/rq_parity/.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from rq import Queue as RqQueue

from bench.rq_worker import SimpleWorker  # rq's, its command channel polled promptly
from runfleet import rqface
from runfleet.store.config import Settings
from runfleet.worker.process import Worker
from tests.fleet.flows import add


def produce(q: Any, tag: str) -> tuple[Any, list[Any]]:
    job = q.enqueue(add, 2, 3, job_id=f"compat-{tag}")
    batch = q.enqueue_many(
        [q.prepare_data(add, (i, i), job_id=f"compat-{tag}-{i}") for i in range(3)]
    )
    return job, batch


def test_producer_snippet_on_rq(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    q = RqQueue(f"compat-{uuid.uuid4().hex[:6]}", connection=conn)
    tag = f"rq-{uuid.uuid4().hex[:6]}"
    job, batch = produce(q, tag)
    SimpleWorker([q], connection=conn).work(burst=True)
    assert job.id == f"compat-{tag}"
    assert job.return_value() == 5
    assert [j.return_value() for j in batch] == [0, 2, 4]


async def test_producer_snippet_on_runfleet(settings: Settings) -> None:
    worker = Worker(settings, queues=["default"], concurrency=4)
    task = asyncio.create_task(worker.run())
    try:
        q = rqface.Queue(
            "default",
            database_url=settings.database_url,
            redis_url=settings.redis_url,
            settings=settings,
        )
        job, batch = await asyncio.to_thread(produce, q, "rf")
        assert job.id == "compat-rf"
        assert await asyncio.to_thread(job.wait, 15) == 5
        assert [await asyncio.to_thread(j.wait, 15) for j in batch] == [0, 2, 4]
        assert await asyncio.to_thread(job.return_value) == 5
        # Re-enqueueing the same id joins the run instead of duplicating it.
        again = await asyncio.to_thread(q.enqueue, add, 2, 3, job_id="compat-rf")
        assert await asyncio.to_thread(again.return_value) == 5
        await asyncio.to_thread(q.close)
    finally:
        worker.stop(hard=True)
        await asyncio.wait_for(task, 15)


def test_conflicting_reuse_of_an_id_is_refused(settings: Settings) -> None:
    from runfleet.store.errors import ExecutionIdentityConflict

    with rqface.Queue("default", settings=settings) as q:
        q.enqueue(add, 1, 1, job_id="same")
        with pytest.raises(ExecutionIdentityConflict) as info:
            q.enqueue(add, 1, 2, job_id="same")
        assert info.value.field == "payload"
