"""The gate of a limited queue (real Redis): a refused run is parked once however often it
is refused, and each freed slot moves the oldest parked wake to the recovery lane."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from runfleet.broker.codec import decode
from runfleet.broker.gate import Gate
from runfleet.broker.keys import Keys
from runfleet.broker.streams import Lane, Streams


async def test_park_once_then_move_oldest_first(redis_url: str, redis_prefix: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        streams = Streams(client, redis_prefix)
        gate = Gate(client, redis_prefix, streams)
        await gate.park([("serial", "first", "f"), ("serial", "second", "f")])
        await gate.park([("serial", "first", "f")])  # refused again: still one entry, first
        assert await client.zcard(Keys(redis_prefix).gate("serial")) == 2
        assert await gate.open(["serial"]) == 1
        entries: list[Any] = await client.xrange(streams.stream_key("serial", Lane.RECOVERY)) or []
        assert [decode(fields[b"m"]).run for _id, fields in entries] == ["first"]
        assert await gate.open(["serial", "serial"]) == 1  # only one left
        assert await gate.open(["serial"]) == 0
        await client.zadd(Keys(redis_prefix).gate("serial"), {b"\xff\xfe": 1.0})
        assert await gate.open(["serial"]) == 0  # a stranger's bytes: dropped, logged
    finally:
        await client.aclose()


async def test_a_started_run_leaves_the_gate_so_a_freed_slot_wakes_a_waiting_one(
    redis_url: str, redis_prefix: str
) -> None:
    """A run refused once and started by another path (it took a displaced run's slot)
    drops its entry: the next freed slot wakes a run still waiting, not the started one."""
    client = Redis.from_url(redis_url)
    try:
        streams = Streams(client, redis_prefix)
        gate = Gate(client, redis_prefix, streams)
        await gate.park([("serial", "started", "f")])
        await gate.park([("serial", "waiting", "f")])
        await gate.unpark([("serial", "started", "f"), ("serial", "never-parked", "f")])
        assert await gate.open(["serial"]) == 1
        entries: list[Any] = await client.xrange(streams.stream_key("serial", Lane.RECOVERY)) or []
        assert [decode(fields[b"m"]).run for _id, fields in entries] == ["waiting"]
        await gate.unpark([])  # nothing to do
    finally:
        await client.aclose()
