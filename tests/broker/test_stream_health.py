"""Queue lanes checked and repaired by one script (``broker.stream_health``), and a
sweep's appends that say whether the group will deliver them, against a real Redis."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from runfleet.broker.codec import StreamMessage
from runfleet.broker.keys import GROUP
from runfleet.broker.stream_health import Fault, StreamHealth
from runfleet.broker.streams import Streams

AHEAD = "99999999999999-0"


def msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "schedule", "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


async def _cmd(r: Redis, *args: str) -> Any:
    return await r.execute_command(*args)  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated


async def _runs(streams: Streams, queue: str) -> list[str]:
    return [d.message.run for d in await streams.read("c1", [queue], count=50, block_ms=0)]


async def test_a_group_ahead_is_found_and_rewound_to_what_it_had_delivered(
    redis: Redis, streams: Streams
) -> None:
    health = StreamHealth(redis)
    key = streams.stream_key("q")
    await streams.ensure_groups(["q"])
    await streams.publish_many([("q", msg("seen"))])
    assert await _runs(streams, "q") == ["seen"]
    (before,) = [g["last-delivered-id"] for g in await redis.xinfo_groups(key)]
    assert (await health.check(key)).fault is None
    await _cmd(redis, "XGROUP", "SETID", key, GROUP, AHEAD)
    await streams.publish_many([("q", msg("hidden"))])
    assert await _runs(streams, "q") == []  # stranded: nothing is delivered
    found = await health.check(key)
    assert found.fault is Fault.GROUP_AHEAD and found.delivered == AHEAD
    assert (await health.check(key)).fault is Fault.GROUP_AHEAD  # check changes nothing
    repaired = await health.repair(key, before.decode())
    assert repaired.fault is Fault.GROUP_AHEAD and repaired.found == before.decode()
    assert await _runs(streams, "q") == ["hidden"]  # what the fault hid, delivered at once
    assert (await health.repair(key)).fault is None


async def test_without_a_rewind_id_the_group_goes_to_the_streams_last_id(
    redis: Redis, streams: Streams
) -> None:
    health = StreamHealth(redis)
    key = streams.stream_key("q")
    await streams.ensure_groups(["q"])
    ids = await streams.publish_many([("q", msg("a")), ("q", msg("b"))])
    await _cmd(redis, "XGROUP", "SETID", key, GROUP, AHEAD)
    repaired = await health.repair(key, AHEAD)  # an id past the stream is never used
    assert repaired.fault is Fault.GROUP_AHEAD and repaired.found == ids[-1]
    await streams.publish_many([("q", msg("c"))])
    assert await _runs(streams, "q") == ["c"]


async def test_a_wrong_type_key_and_a_missing_group_are_repaired(
    redis: Redis, streams: Streams
) -> None:
    health = StreamHealth(redis)
    key = streams.stream_key("q")
    await redis.set(key, b"x")
    found = await health.check(key)
    assert found.fault is Fault.WRONG_TYPE and found.found == "string" and found.fault.strands
    assert (await health.repair(key)).fault is Fault.WRONG_TYPE
    assert (await health.check(key)).fault is None
    await _cmd(redis, "XGROUP", "DESTROY", key, GROUP)
    await streams.publish_many([("q", msg("orphan"))])
    found = await health.check(key)
    assert found.fault is Fault.NO_GROUP and not found.fault.strands
    assert (await health.repair(key)).fault is Fault.NO_GROUP
    assert await _runs(streams, "q") == ["orphan"]  # recreated from id 0
    await redis.delete(key)
    assert (await health.check(key)).fault is Fault.MISSING


async def test_a_checked_append_says_whether_the_group_will_deliver_it(
    redis: Redis, streams: Streams
) -> None:
    key = streams.stream_key("q")
    await streams.ensure_groups(["q"])
    assert await streams.publish_checked([("q", msg("a")), ("q", msg("b"))]) == [True, True]
    await _cmd(redis, "XGROUP", "SETID", key, GROUP, AHEAD)
    assert await streams.publish_checked([("q", msg("c"))]) == [False]
    await _cmd(redis, "XGROUP", "DESTROY", key, GROUP)
    assert await streams.publish_checked([("q", msg("d"))]) == [True]  # reads recreate it
