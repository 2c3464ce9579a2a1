"""The recovery lane: read before any backlog, within the free slots, kept like the main one."""

from __future__ import annotations

from redis.asyncio import Redis

from runfleet.broker.codec import StreamMessage
from runfleet.broker.streams import Delivery, Lane, QueueDepth, Streams
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.types import Waiting, WaitingReason
from tests.store.helpers import make_parked
from tests.support.polling import until


def msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "wake", "run": run, "flow": "f.x", "reason": "sweep", "at_ms": 1}
    )


def runs(deliveries: list[Delivery]) -> list[str]:
    return [d.message.run for d in deliveries]


async def test_recovery_lane_is_read_before_the_backlog_of_every_queue(streams: Streams) -> None:
    await streams.ensure_groups(["a", "b"])
    await streams.publish_many([("a", msg(f"backlog-{i}")) for i in range(50)])
    await streams.publish("b", msg("stolen-b"), Lane.RECOVERY)
    await streams.publish("a", msg("stolen-a"), Lane.RECOVERY)

    # Three free slots: both recovered runs first (queue order within the lane), then one
    # from the backlog; never more than the slots (COUNT is per stream in XREADGROUP).
    first = await streams.read("c1", ["a", "b"], count=3, block_ms=0)
    assert runs(first) == ["stolen-a", "stolen-b", "backlog-0"]
    assert [d.lane for d in first] == [Lane.RECOVERY, Lane.RECOVERY, Lane.NORMAL]
    assert await streams.depth("a", Lane.RECOVERY) == QueueDepth(undelivered=0, pending=1)
    assert await streams.lag("a") == 50 + 1  # both lanes: 49 undelivered + 2 pending

    # Acks go to the lane each delivery came from.
    assert await streams.ack_many(first) == 3
    assert await streams.depth("a", Lane.RECOVERY) == QueueDepth(0, 0)
    assert await streams.depth("b", Lane.RECOVERY) == QueueDepth(0, 0)
    (again,) = await streams.read("c1", ["a", "b"], count=1, block_ms=0)
    assert again.message.run == "backlog-1"
    assert await streams.ack(again.queue, again.entry_id, again.lane) is True

    # A blocked reader is woken by an entry on the recovery lane.
    await streams.publish("b", msg("late"), Lane.RECOVERY)
    (late,) = await streams.read("c1", ["b"], count=1, block_ms=2000)
    assert (late.message.run, late.lane) == ("late", Lane.RECOVERY)


async def test_recovery_lane_is_reclaimed_first_and_recreated(
    streams: Streams, redis: Redis
) -> None:
    await streams.ensure_groups(["q"])
    await streams.publish_many([("q", msg(f"n{i}")) for i in range(3)])
    await streams.publish("q", msg("r0"), Lane.RECOVERY)
    taken = await streams.read("dead", ["q"], count=4, block_ms=0)
    assert runs(taken)[0] == "r0"

    got = await until(
        lambda: streams.reclaim("survivor", ["q"], min_idle_ms=50, count=2),
        accept=lambda got: bool(got),
    )
    assert runs(got) == ["r0", "n0"] and got[0].lane is Lane.RECOVERY

    # What a Redis restart without persistence does: the lane's stream and group vanish.
    await redis.delete(streams.stream_key("q", Lane.RECOVERY))
    assert await streams.read("c1", ["q"], count=5, block_ms=0) == []  # all normal ones taken
    await streams.publish("q", msg("after"), Lane.RECOVERY)
    assert runs(await streams.read("c1", ["q"], count=5, block_ms=0)) == ["after"]


async def test_an_answered_wait_wakes_its_started_run_on_the_recovery_lane(
    store: Store, queue: AsyncQueue
) -> None:
    parked = await make_parked(store, "answered", Waiting(WaitingReason.EVENT), deferred="paid")
    assert parked.queue == queue.name and parked.epoch == 1

    assert await queue.complete("answered", "paid", {"amount": 12})
    assert await queue.streams.depth(queue.name, Lane.RECOVERY) == QueueDepth(1, 0)
    (woken,) = await queue.streams.read("c1", [queue.name], count=1, block_ms=0)
    assert (woken.message.run, woken.lane) == ("answered", Lane.RECOVERY)
