"""Producer calls during a Postgres outage: retried for RUNFLEET_PRODUCER_RETRY_FOR, then
``Unavailable`` naming the service; a service back within the budget is never noticed."""

from __future__ import annotations

import asyncio
import time

import pytest

import tests.chaos.flows as cf
from runfleet.ops.servers.postgres import ThrowawayPostgres, postgres_stop
from runfleet.producer import AsyncQueue
from runfleet.rqface import Queue
from runfleet.store.config import Settings
from runfleet.store.errors import Unavailable
from runfleet.store.types import RunStatus

pytestmark = pytest.mark.chaos


async def test_calls_during_an_outage_raise_unavailable_after_the_budget(
    pg_settings: Settings, own_postgres: ThrowawayPostgres
) -> None:
    budget = 1.5
    ours = pg_settings.model_copy(update={"producer_retry_for": budget})
    async with AsyncQueue("default", settings=ours) as queue:
        run = await queue.enqueue(cf.five_steps, 1)
        await asyncio.to_thread(postgres_stop, own_postgres, "immediate")
        for call in (
            lambda: queue.enqueue(cf.five_steps, 2),
            run.get_status,
            lambda: run.result(timeout=30),
            lambda: queue.cancel(run.id),
            lambda: queue.complete(run.id, "event"),
        ):
            started = time.monotonic()
            with pytest.raises(Unavailable) as raised:
                await call()
            elapsed = time.monotonic() - started
            assert raised.value.service == "postgres"
            assert "postgres unavailable" in str(raised.value)
            assert budget <= elapsed < budget + 3.0, elapsed
        own_postgres.start()
        assert await run.get_status() is RunStatus.PENDING  # the queue recovers by itself


def test_sync_queue_raises_unavailable_too(
    pg_settings: Settings, own_postgres: ThrowawayPostgres
) -> None:
    queue = Queue("default", settings=pg_settings.model_copy(update={"producer_retry_for": 1.0}))
    try:
        run = queue.enqueue(cf.five_steps, 1)
        postgres_stop(own_postgres, "immediate")
        with pytest.raises(Unavailable):
            run.get_status()
    finally:
        queue.close()


async def test_a_service_back_within_the_budget_is_not_an_error(
    pg_settings: Settings, own_postgres: ThrowawayPostgres
) -> None:
    ours = pg_settings.model_copy(update={"producer_retry_for": 20.0})
    async with AsyncQueue("default", settings=ours) as queue:
        first = await queue.enqueue(cf.five_steps, 1)
        await asyncio.to_thread(postgres_stop, own_postgres, "immediate")

        async def back_in_2s() -> None:
            await asyncio.sleep(2)
            await asyncio.to_thread(own_postgres.start)

        restarting = asyncio.create_task(back_in_2s())
        started = time.monotonic()
        run = await queue.enqueue(cf.five_steps, 2, run_id="during-outage")
        elapsed = time.monotonic() - started
        await restarting
        assert 1.5 < elapsed < 15, elapsed
        assert run.id == "during-outage"
        assert await run.get_status() is RunStatus.PENDING
        assert await first.get_status() is RunStatus.PENDING


def test_sync_calls_in_the_callers_thread_keep_the_budget(
    pg_settings: Settings, own_postgres: ThrowawayPostgres
) -> None:
    """The sync Queue's driven calls (enqueue, reads) retry in the caller's own thread:
    Unavailable after the budget, and a server back within it is never noticed."""
    import threading

    budget = 1.5
    with Queue(
        "default", settings=pg_settings.model_copy(update={"producer_retry_for": budget})
    ) as queue:
        job = queue.enqueue(cf.five_steps, 1)
        postgres_stop(own_postgres, "immediate")
        for call in (lambda: queue.enqueue(cf.five_steps, 2), job.get_status, job.return_value):
            started = time.monotonic()
            with pytest.raises(Unavailable) as raised:
                call()
            assert raised.value.service == "postgres"
            assert budget <= time.monotonic() - started < budget + 3.0
        own_postgres.start()
        assert job.get_status().value == "queued"  # the blocking pool recovers by itself
        assert not queue._driver.connected  # every call above ran in this thread
    with Queue(
        "default", settings=pg_settings.model_copy(update={"producer_retry_for": 20.0})
    ) as queue:
        queue.enqueue(cf.five_steps, 3)
        postgres_stop(own_postgres, "immediate")
        restart = threading.Timer(2.0, own_postgres.start)
        restart.start()
        started = time.monotonic()
        during = queue.enqueue(cf.five_steps, 4, job_id="sync-during-outage")
        elapsed = time.monotonic() - started
        restart.join()
        assert 1.5 < elapsed < 15, elapsed
        assert during.id == "sync-during-outage"
        assert during.get_status().value == "queued"
