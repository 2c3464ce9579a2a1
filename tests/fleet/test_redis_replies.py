"""Redis error replies never stop a worker: Redis only hints."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

import tests.fleet.flows as flows
from runfleet.broker.keys import Keys
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def test_wrongtype_stream_key_neither_kills_the_worker_nor_strands_runs(
    settings: Settings, store: Store
) -> None:
    """The queue's stream is replaced by a string: every XREADGROUP/XADD answers WRONGTYPE.

    The worker keeps running, and a run admitted meanwhile still completes: its wake
    cannot be published, so the lost-wake sweep falls back to driving it locally.
    """
    worker = WorkerProc(settings, concurrency=2)
    client = aioredis.Redis.from_url(settings.redis_url)
    keys = Keys(settings.redis_prefix)
    try:
        await worker.wait_started()
        await client.delete(keys.stream("default"), keys.recovery_stream("default"))
        await client.set(keys.stream("default"), b"not a stream")
        await client.set(keys.recovery_stream("default"), b"not a stream either")
        async with AsyncQueue("default", settings=settings) as queue:
            run = await queue.enqueue(flows.sleepy, 10, "wrongtype")
            assert (await run.result(timeout=30))["tag"] == "wrongtype"
            assert worker.proc.poll() is None, worker.log()[-3000:]
            await asyncio.sleep(1.0)  # several read-loop failures later: still alive
            assert worker.proc.poll() is None, worker.log()[-3000:]
            await client.delete(keys.stream("default"), keys.recovery_stream("default"))
            again = await queue.enqueue(flows.sleepy, 10, "healed")
            assert (await again.result(timeout=30))["tag"] == "healed"
        # the worker met the broken key: a failed read, or the tick's repair got there first
        assert "stream.read_failed" in worker.log() or "stream.repaired" in worker.log()
        await until(lambda: _alive(worker), 1, "worker alive at the end")
    finally:
        await client.aclose()
        worker.close()


async def _alive(worker: WorkerProc) -> bool:
    return worker.proc.poll() is None
