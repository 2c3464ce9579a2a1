"""Garbage on a queue stream is logged, acknowledged and dropped; real runs go on.

A stream entry is only a hint, so one that cannot be decoded must cost nothing: the
worker neither crashes nor leaves it pending in the group (where it would be
redelivered forever), and the runs enqueued around it complete.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgpack
import pytest
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.codec import FIELD
from runfleet.broker.keys import GROUP
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from tests.fleet.procs import WorkerProc, records
from tests.support.polling import until

GARBAGE: list[dict[bytes, bytes]] = [
    {FIELD: b"\xc1 not msgpack at all"},  # 0xc1 is never valid msgpack
    {FIELD: msgpack.packb([1, 2, 3])},  # msgpack, but a list
    {FIELD: msgpack.packb({"v": 1, "kind": "explode", "run": "", "flow": 7, "at_ms": -1})},
    {FIELD: msgpack.packb({"v": 2, "kind": "wake", "run": "r", "flow": "f", "at_ms": 1})},
    {b"other": b"no m field"},
]


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def test_malformed_entries_are_dropped_and_real_runs_complete(
    settings: Settings, store: Store, redis: Redis
) -> None:
    stream = f"{settings.redis_prefix}:q:default"
    worker = WorkerProc(settings)
    try:
        await worker.wait_started()
        async with AsyncQueue("default", settings=settings) as queue:
            runs = []
            for i in range(12):
                await redis.xadd(stream, GARBAGE[i % len(GARBAGE)])  # type: ignore[arg-type]  # garbage entries on purpose
                runs.append(await queue.enqueue(flows.sleepy, 20, f"m{i}"))
            await redis.xadd(stream, GARBAGE[0])  # type: ignore[arg-type]  # garbage entries on purpose
            for i, run in enumerate(runs):
                assert (await run.result(timeout=10))["tag"] == f"m{i}"

        async def drained() -> bool:
            summary = await redis.xpending(stream, GROUP)
            return int(summary["pending"]) == 0

        await until(drained, 10, "no pending entries in the group")
        for run in runs:
            row = await store.runs.get(run.id)
            assert row is not None and row.status is RunStatus.COMPLETED
            assert len(await records(store, run.id, Kind.TRANSITIONED)) == 1
        log = worker.log()
        assert "stream.malformed" in log, log[-3000:]  # rate-limited: one line per 10 s
        assert worker.proc.poll() is None
    finally:
        worker.close()
