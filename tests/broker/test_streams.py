"""Queue streams against a real Redis: bounded reads, malformed drops, reclaim, recovery, lag."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from redis.asyncio import Redis

import runfleet.broker.streams
from runfleet.broker import hostile
from runfleet.broker.codec import FIELD, StreamMessage, decode
from runfleet.broker.keys import GROUP
from runfleet.broker.streams import Delivery, Lane, QueueDepth, Streams
from tests.support.polling import until


def msg(run: str, kind: str = "schedule") -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": kind, "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def runs(deliveries: list[Delivery]) -> list[str]:
    return [d.message.run for d in deliveries]


async def test_publish_then_read_round_trip(streams: Streams) -> None:
    await streams.ensure_groups(["default"])
    entry_id = await streams.publish("default", msg("r1", "wake"))
    got = await streams.read("c1", ["default"], count=10, block_ms=0)
    assert got == [Delivery("default", entry_id, msg("r1", "wake"))]
    assert await streams.ack("default", entry_id) is True
    assert await streams.ack("default", entry_id) is False


async def test_ensure_groups_is_idempotent_and_delivers_earlier_entries(streams: Streams) -> None:
    await streams.publish("early", msg("before-group"))  # the stream exists, no group yet
    await streams.ensure_groups(["early", "early"])
    await streams.ensure_groups(["early"])
    assert runs(await streams.read("c1", ["early"], count=5, block_ms=0)) == ["before-group"]


async def test_read_never_returns_more_than_count_across_queues(streams: Streams) -> None:
    queues = ["high", "default", "low"]
    await streams.ensure_groups(queues)
    await streams.publish_many([(q, msg(f"{q}-{i}")) for q in queues for i in range(5)])

    first = await streams.read("c1", queues, count=4, block_ms=0)
    # Exactly the free slots, earlier queues first (XREADGROUP alone would give 4 per queue).
    assert runs(first) == ["high-0", "high-1", "high-2", "high-3"]
    second = await streams.read("c1", queues, count=3, block_ms=0)
    assert runs(second) == ["high-4", "default-0", "default-1"]
    depths = [await streams.depth(q) for q in queues]
    assert depths == [QueueDepth(0, 5), QueueDepth(3, 2), QueueDepth(5, 0)]


async def test_count_zero_consumes_nothing_and_does_not_touch_redis(
    streams: Streams, redis_prefix: str, dead_redis: Redis
) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish("default", msg("r1"))
    assert await streams.read("c1", ["default"], count=0, block_ms=1000) == []
    assert await streams.read("c1", ["default"], count=-3, block_ms=1000) == []
    assert await streams.depth("default") == QueueDepth(undelivered=1, pending=0)
    # A client whose server is gone proves no command is sent at all.
    offline = Streams(dead_redis, redis_prefix)
    started = time.monotonic()
    assert await offline.read("c1", ["default"], count=0, block_ms=1000) == []
    assert time.monotonic() - started < 0.1


async def test_malformed_entries_are_acked_and_dropped(
    streams: Streams, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await streams.ensure_groups(["default"])
    key = streams.stream_key("default")
    await streams.publish("default", msg("good-1"))
    bad_bytes = _text(await redis.xadd(key, {b"m": b"\xc1 not msgpack"}))
    no_field = _text(await redis.xadd(key, {b"other": b"x"}))
    await streams.publish("default", msg("good-2"))

    before = hostile.HOSTILE_INPUT.labels("stream")._value.get()
    with caplog.at_level(logging.WARNING, logger="runfleet.broker.streams"):
        got = await streams.read("c1", ["default"], count=10, block_ms=0)
    assert runs(got) == ["good-1", "good-2"]
    # Both counted; logged at a bounded rate: the first line, the second suppressed.
    assert hostile.HOSTILE_INPUT.labels("stream")._value.get() == before + 2
    # Log fields arrive through logging's ``extra``, i.e. as record attributes.
    (dropped,) = [r.__dict__ for r in caplog.records if r.getMessage() == "stream.malformed"]
    assert (dropped["entry_id"], dropped["queue"]) == (bad_bytes, "default")
    assert dropped["reason"] and dropped["suppressed"] == 0
    assert no_field
    # Acknowledged: only the two good deliveries remain pending, nothing is left to deliver.
    assert await streams.depth("default") == QueueDepth(undelivered=0, pending=2)


async def test_read_blocks_until_a_publish_on_any_queue(streams: Streams) -> None:
    queues = ["a", "b"]
    await streams.ensure_groups(queues)

    async def publish_later() -> None:
        await asyncio.sleep(0.1)
        await streams.publish("b", msg("late"))

    started = time.monotonic()
    publisher = asyncio.create_task(publish_later())
    got = await streams.read("c1", queues, count=1, block_ms=3000)
    await publisher
    assert runs(got) == ["late"]
    assert time.monotonic() - started < 2.0


async def test_read_times_out_empty(streams: Streams) -> None:
    await streams.ensure_groups(["default"])
    started = time.monotonic()
    assert await streams.read("c1", ["default"], count=5, block_ms=200) == []
    assert 0.15 < time.monotonic() - started < 2.0


async def test_reclaim_takes_idle_entries_of_a_dead_consumer(streams: Streams) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish_many([("default", msg(f"r{i}")) for i in range(3)])
    taken = await streams.read("dead-consumer", ["default"], count=3, block_ms=0)
    assert len(taken) == 3  # read, never acked: the consumer "died" here

    # Fresh entries (not idle long enough) are left with their consumer.
    assert await streams.reclaim("survivor", ["default"], min_idle_ms=60_000, count=10) == []
    reclaimed = await until(
        lambda: streams.reclaim("survivor", ["default"], min_idle_ms=100, count=2),
        accept=lambda got: len(got) > 0,
    )
    assert runs(reclaimed) == ["r0", "r1"]  # never more than count
    rest = await streams.reclaim("survivor", ["default"], min_idle_ms=100, count=10)
    assert runs(rest) == ["r2"]
    await streams.ack_many([(d.queue, d.entry_id) for d in reclaimed + rest])
    assert await streams.depth("default") == QueueDepth(0, 0)


async def test_reclaim_drops_malformed_entries(streams: Streams, redis: Redis) -> None:
    await streams.ensure_groups(["default"])
    await redis.xadd(streams.stream_key("default"), {b"m": b"junk"})
    await streams.publish("default", msg("ok"))
    # The dead consumer reads raw (as an older, buggy worker might) so junk sits pending.
    await redis.xreadgroup(GROUP, "dead", {streams.stream_key("default"): ">"})
    got = await until(
        lambda: streams.reclaim("survivor", ["default"], min_idle_ms=50, count=10),
        accept=lambda got: len(got) > 0,
    )
    assert runs(got) == ["ok"]
    assert await streams.depth("default") == QueueDepth(0, 1)


async def test_group_recreated_after_keys_vanish(
    streams: Streams, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await streams.ensure_groups(["default", "other"])
    await streams.publish("default", msg("lost"))
    # What FLUSHALL does to this prefix (the server may be shared, so only this prefix's keys go).
    await redis.delete(streams.stream_key("default"), streams.stream_key("other"))
    with caplog.at_level(logging.WARNING, logger="runfleet.broker.streams"):
        assert await streams.read("c1", ["default", "other"], count=5, block_ms=0) == []
    assert "stream.group_recreated" in [r.getMessage() for r in caplog.records]
    await streams.publish("other", msg("after"))
    assert runs(await streams.read("c1", ["default", "other"], count=5, block_ms=0)) == ["after"]


async def test_group_destroyed_while_stream_remains(streams: Streams, redis: Redis) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish("default", msg("kept"))
    await redis.xgroup_destroy(streams.stream_key("default"), GROUP)
    # Recreated from id 0: the entry still in the stream is delivered, not skipped.
    assert runs(await streams.read("c1", ["default"], count=5, block_ms=0)) == ["kept"]


async def test_lag_counts_undelivered_and_pending(streams: Streams) -> None:
    assert await streams.lag("missing") == 0
    await streams.publish("default", msg("no-group-yet"))
    assert await streams.lag("default") == 1
    await streams.ensure_groups(["default"])
    await streams.publish_many([("default", msg(f"r{i}")) for i in range(2)])
    assert await streams.lag("default") == 3
    got = await streams.read("c1", ["default"], count=2, block_ms=0)
    assert await streams.depth("default") == QueueDepth(undelivered=1, pending=2)
    assert await streams.lag("default") == 3
    assert await streams.ack_many([(d.queue, d.entry_id) for d in got]) == 2
    assert await streams.lag("default") == 1


async def test_publish_trims_approximately(streams: Streams, redis: Redis) -> None:
    streams.maxlen = 10
    await streams.publish_many([("default", msg(f"r{i}")) for i in range(600)])
    for i in range(10):
        await streams.publish("default", msg(f"single-{i}"))
    length = await redis.xlen(streams.stream_key("default"))
    assert 10 <= length < 300  # "~" trims whole nodes (100 entries each by default)
    with pytest.raises(ValueError):
        streams.maxlen = 0


async def test_publish_many_encodes_everything_before_sending(streams: Streams) -> None:
    assert await streams.publish_many([]) == []
    ids = await streams.publish_many([("a", msg("1")), ("b", msg("2")), ("a", msg("3"))])
    assert len(ids) == 3
    assert await streams.lag("a") == 2
    assert await streams.lag("b") == 1


async def test_publish_many_of_one_message_is_one_plain_xadd(
    streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single enqueue's wake (the sync producer's every call) builds no pipeline."""

    def no_pipeline(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pipeline for one message")

    monkeypatch.setattr(streams._redis, "pipeline", no_pipeline)
    await streams.ensure_groups(["solo"])
    (entry_id,) = await streams.publish_many([("solo", msg("r1"))], Lane.RECOVERY)
    assert await streams.lag("solo") == 1
    (got,) = await streams.read("c1", ["solo"], count=5, block_ms=0)
    assert (got.entry_id, got.message, got.lane) == (entry_id, msg("r1"), Lane.RECOVERY)


async def test_prune_consumers_keeps_those_with_pending_entries(streams: Streams) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish_many([("default", msg("r1")), ("default", msg("r2"))])
    await streams.read("holder", ["default"], count=1, block_ms=0)  # r1 stays pending
    (done,) = await streams.read("finished", ["default"], count=1, block_ms=0)
    await streams.ack(done.queue, done.entry_id)
    assert await streams.prune_consumers(["default", "nostream"], idle_ms=3_600_000) == 0
    assert await streams.prune_consumers(["default"], idle_ms=0) == 1
    assert runs(await streams.reclaim("new", ["default"], min_idle_ms=0, count=5)) == ["r1"]


async def test_a_large_batch_is_published_by_script_in_input_order(
    streams: Streams, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interleaved queues and lanes, more messages than one script call carries: every
    entry lands once on its own stream, in input order there, and each caller position
    gets its own entry's id."""
    monkeypatch.setattr(runfleet.broker.streams, "PUBLISH_CHUNK", 7)
    calls: list[int] = []
    script = streams._publish_script

    async def counted(*, keys: list[str], args: list[Any]) -> list[bytes]:
        calls.append(len(args) - 2)
        return await script(keys=keys, args=args)  # type: ignore[no-any-return]  # redis-py's script call answers Any

    monkeypatch.setattr(streams, "_publish_script", counted)
    items = [(("a", "b")[i % 2], msg(f"r{i}")) for i in range(40)]
    ids = await streams.publish_many(items)
    assert sorted(calls) == [6, 6, 7, 7, 7, 7]  # 20 per queue, chunks of 7
    for queue in ("a", "b"):
        entries: Any = await redis.xrange(streams.stream_key(queue))
        published = [(_text(entry_id), decode(fields[FIELD]).run) for entry_id, fields in entries]
        order = [run for _id, run in published]
        assert order == [m.run for q, m in items if q == queue]
        by_id = dict(published)
        assert [by_id[ids[i]] for i, (q, _m) in enumerate(items) if q == queue] == order
    recovery = await streams.publish_many([("a", msg(f"x{i}")) for i in range(10)], Lane.RECOVERY)
    assert len(set(recovery)) == 10
    assert await redis.xlen(streams.stream_key("a", Lane.RECOVERY)) == 10
