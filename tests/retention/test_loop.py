"""RUNFLEET_RETENTION and the workers' retention loop: one pruner per fleet, errors survive."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

import tests.retention.flows as flows
from runfleet.broker.keys import GROUP
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.retention import Retention
from runfleet.worker.process import Worker
from runfleet.worker.retention import RetentionLoop
from tests.retention.test_prune import runs_by_status


def test_retention_setting_reads_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().retention_ms is None
    monkeypatch.setenv("RUNFLEET_RETENTION", "30d")
    assert Settings().retention_ms == 30 * 86_400_000
    monkeypatch.setenv("RUNFLEET_RETENTION", "90")
    assert Settings().retention_ms == 90_000
    monkeypatch.setenv("RUNFLEET_RETENTION", "off")
    assert Settings().retention is None
    for bad in ("soon", "0s", "-1d"):
        monkeypatch.setenv("RUNFLEET_RETENTION", bad)
        with pytest.raises(ValidationError, match="retention"):
            Settings()


async def test_loop_prunes_and_only_one_process_per_pass(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    for i in range(4):
        await (await queue.enqueue(flows.leaf, i)).result(timeout=20)
    held = await queue.enqueue(flows.waits)
    aged = settings.model_copy(update={"retention": 0.001})
    one = RetentionLoop(store, aged, worker.streams, ["default"], batch=2, consumer_idle_ms=0)
    other = RetentionLoop(store, aged, worker.streams, ["default"], batch=2)
    stream = worker.streams.stream_key("default")
    redis = Redis.from_url(settings.redis_url)
    await redis.xgroup_createconsumer(stream, GROUP, "ghost:1:dead")

    async with Retention(store.db).exclusive() as mine:
        assert mine
        assert await one.tick() is None, "a pass while another process holds the lock"
    assert len(await runs_by_status(store)) == 5

    done = await one.tick()
    assert done is not None and done.deleted.runs == 4 and done.complete
    assert set(await runs_by_status(store)) == {held.id}
    consumers = [c["name"] for c in await redis.xinfo_consumers(stream, GROUP)]
    await redis.aclose()
    assert b"ghost:1:dead" not in consumers, "the dead consumer was pruned with the pass"
    again = await other.tick()
    assert again is not None and again.deleted.runs == 0

    # Unset retention still loops (runs' own TTLs); a stop set before start is harmless.
    stop = asyncio.Event()
    stop.set()
    off = RetentionLoop(store, settings, None, [])
    await asyncio.wait_for(off.run(stop), 1)
    await asyncio.wait_for(one.run(stop), 1)


async def test_loop_survives_a_failing_pass(store: Store, settings: Settings) -> None:
    aged = settings.model_copy(update={"retention": 0.001})
    loop = RetentionLoop(store, aged, None, [])
    await store.close()  # every statement now fails: the pass is logged, not raised
    assert await loop.tick() is None
