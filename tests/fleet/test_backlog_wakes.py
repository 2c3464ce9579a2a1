"""A deep backlog is not a lost one: one stream message per run however long runs wait,
and a wake that really is lost (a refused publish) still found within its bound.

Under the test settings (stale_after 1 s) the old rule, "pending for 2 x stale_after is
lost", re-woke every run of a backlog deeper than two seconds of work; here the backlog
takes many such cycles to drain and must collect no second message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.codec import FIELD, decode
from runfleet.broker.streams import Lane, Streams
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.flows import sleepy
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

BACKLOG = 600
NAP_MS = 25  # 600 x 25 ms over 2 slots: >= 7.5 s of work, ~4 lost-pending cycles of 2 s


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def _unsettled(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (
            await conn.execute("SELECT count(*) FROM runfleet.runs WHERE status <> 'completed'")
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _journal_kinds(url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        rows = await (
            await conn.execute("SELECT kind, count(*) FROM runfleet.journal GROUP BY kind")
        ).fetchall()
    return {str(kind): int(n) for kind, n in rows}


async def _messages(redis: Redis, streams: Streams) -> list[str]:
    """The reason of every message both lanes of ``default`` ever held (none trimmed)."""
    reasons = []
    for lane in Lane:
        for _, fields in await redis.xrange(streams.stream_key("default", lane)) or []:
            packed = fields.get(FIELD) if fields else None
            assert isinstance(packed, bytes), fields
            reasons.append(decode(packed).reason)
    return reasons


async def test_a_deep_backlog_gets_one_message_per_run(
    settings: Settings, store: Store, redis: Redis
) -> None:
    async with AsyncQueue("default", settings=settings) as queue:
        await queue.enqueue_many([EnqueueSpec(sleepy, (NAP_MS,)) for _ in range(BACKLOG)])
    worker = WorkerProc(settings, concurrency=2)
    try:
        await worker.wait_started()
        await until(
            lambda: _unsettled(settings.database_url),
            180,
            "the backlog to drain",
            accept=lambda n: n == 0,
            every=0.2,
        )

        # The readers reached the end: one claim grace later the queue's mark passes it.
        async def marked() -> dict[str, int]:
            return await store.sweeps.wake_marks()

        await until(marked, 15, "the queue's wake mark", accept=lambda m: "default" in m)
    finally:
        worker.close()
    streams = Streams(redis, settings.redis_prefix)
    reasons = await _messages(redis, streams)
    assert len(reasons) == BACKLOG, {r: reasons.count(r) for r in set(reasons)}
    assert "sweep:lost_pending" not in reasons
    kinds = await _journal_kinds(settings.database_url)
    assert kinds.get("claim-lost", 0) == 0, kinds
    assert kinds["claimed-and-activated"] == BACKLOG, kinds


async def test_a_refused_publish_is_found_within_the_bound(
    settings: Settings, store: Store, redis: Redis
) -> None:
    worker = WorkerProc(settings, concurrency=2)
    try:
        await worker.wait_started()
        # A producer whose Redis refuses: the runs are admitted, their wakes never written.
        refused = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
        async with AsyncQueue("default", settings=refused) as queue:
            runs = await queue.enqueue_many([EnqueueSpec(sleepy, (1,)) for _ in range(5)])
        streams = Streams(redis, settings.redis_prefix)
        assert await _messages(redis, streams) == []
        bound_s = settings.lost_wake_within_ms / 1000

        async def completed() -> int:
            rows = await store.runs.get_many([r.id for r in runs])
            return sum(row.status == "completed" for row in rows)

        await until(completed, bound_s + 10, "the lost runs to complete", accept=lambda n: n == 5)
    finally:
        worker.close()
    for run in runs:
        row = await store.runs.get(run.id)
        assert row is not None
        journal = await store.journal.records(run.id)
        activated = [r for r in journal if r.kind == "claimed-and-activated"]
        assert len(activated) == 1
        waited_ms = activated[0].at_ms - row.created_at_ms
        # The bound, plus what a loaded box adds to one dispatch, read and claim.
        assert waited_ms <= settings.lost_wake_within_ms + 3000, (waited_ms, bound_s)
    reasons = await _messages(redis, streams)
    assert reasons.count("sweep:lost_pending") == 5, reasons
