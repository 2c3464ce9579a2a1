"""rq's at_front=True: the admission message goes on the queue's recovery lane, which
workers read before the backlog; without it, the normal lane (FIFO)."""

from __future__ import annotations

from runfleet.broker.streams import Lane
from runfleet.producer import AsyncQueue
from tests.rq_parity import jobs


async def test_at_front_publishes_on_the_recovery_lane(queue: AsyncQueue) -> None:
    redis = queue.session.redis
    normal = queue.streams.stream_key("default", Lane.NORMAL)
    recovery = queue.streams.stream_key("default", Lane.RECOVERY)
    await queue.enqueue(jobs.add, 1, 1)
    await queue.enqueue(jobs.add, 2, 2)
    assert (await redis.xlen(normal), await redis.xlen(recovery)) == (2, 0)
    urgent = await queue.enqueue(jobs.add, 3, 3, at_front=True)
    assert (await redis.xlen(normal), await redis.xlen(recovery)) == (2, 1)
    entries = await redis.xrange(recovery)
    assert entries is not None and len(entries) == 1 and urgent.id in repr(entries[0])
    batch = [queue.prepare_data(jobs.add, (i, i), at_front=True) for i in range(2)]
    await queue.enqueue_many(batch)
    assert (await redis.xlen(normal), await redis.xlen(recovery)) == (2, 3)
