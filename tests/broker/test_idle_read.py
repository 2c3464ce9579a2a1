"""An idle reader waits on a doorbell that consumes nothing, so a frozen reader never holds a wake.

``Streams.read`` waits for new entries with a non-consuming ``XREAD``, then takes them
with the read script. A blocking ``XREADGROUP`` would save that second round trip, but
Redis assigns the entry to the blocked consumer the moment it arrives: a worker frozen
then (SIGSTOP, a GC pause, a partition) would hold the run's wake in its pending list
until the reclaim (3 x stale_after), while other idle workers never see it.
tests/fleet/test_ownership.py::test_full_partition_lapses_before_takeover failed that way
three times in four while the reader blocked in XREADGROUP.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.codec import StreamMessage
from runfleet.broker.streams import Streams
from tests.support.polling import until


def msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "schedule", "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


async def test_a_reader_frozen_after_its_wake_leaves_the_entry_to_another(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen_client = connect(redis_url)
    other_client = connect(redis_url)
    frozen = asyncio.Event()
    never = asyncio.Event()
    a = Streams(frozen_client, redis_prefix)
    real: Any = a._redis.execute_command  # the client the reader sends its commands with

    async def execute(*args: Any, **options: Any) -> Any:
        reply = await real(*args, **options)
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        if "BLOCK" in (w.upper() for w in words):
            frozen.set()
            await never.wait()  # the process stops right after its blocking read answers
        return reply

    monkeypatch.setattr(a._redis, "execute_command", execute)
    try:
        await a.ensure_groups(["default"])
        reading = asyncio.create_task(a.read("c-frozen", ["default"], count=8, block_ms=5000))
        await asyncio.sleep(0.2)  # a is blocked in its wait
        await Streams(other_client, redis_prefix).publish("default", msg("r1"))
        await until(lambda: _is_set(frozen), timeout=5)
        got = await Streams(other_client, redis_prefix).read(
            "c-other", ["default"], count=8, block_ms=2000
        )
        assert [d.message.run for d in got] == ["r1"], "the frozen reader took the wake"
        reading.cancel()
    finally:
        never.set()
        await frozen_client.aclose()
        await other_client.aclose()


async def _is_set(event: asyncio.Event) -> bool:
    return event.is_set()


async def test_an_idle_read_returns_the_entry_published_while_it_waits(
    redis: Redis, redis_url: str, redis_prefix: str
) -> None:
    reader = Streams(redis, redis_prefix)
    await reader.ensure_groups(["default"])
    reading = asyncio.create_task(reader.read("c1", ["default"], count=8, block_ms=5000))
    await asyncio.sleep(0.2)
    producer = connect(redis_url)
    try:
        await Streams(producer, redis_prefix).publish("default", msg("r1"))
        got = await asyncio.wait_for(reading, 5)
    finally:
        await producer.aclose()
    assert [d.message.run for d in got] == ["r1"]


# ---- peek: the doorbell's entry claimed from the doorbell's own reply -------------------


async def test_a_peeking_reader_frozen_after_its_doorbell_leaves_the_entry_to_another(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``peek`` saves the group read's round trip without taking anything: a reader frozen
    right after its doorbell rang holds no entry, and another reader's group read gets it."""
    frozen_client = connect(redis_url)
    other_client = connect(redis_url)
    frozen = asyncio.Event()
    never = asyncio.Event()
    a = Streams(frozen_client, redis_prefix)
    real: Any = a._redis.execute_command

    async def execute(*args: Any, **options: Any) -> Any:
        reply = await real(*args, **options)
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        if "BLOCK" in (w.upper() for w in words):
            frozen.set()
            await never.wait()
        return reply

    monkeypatch.setattr(a._redis, "execute_command", execute)
    try:
        await a.ensure_groups(["default"])
        reading = asyncio.create_task(
            a.read("c-frozen", ["default"], count=8, block_ms=5000, peek=True)
        )
        await asyncio.sleep(0.2)
        await Streams(other_client, redis_prefix).publish("default", msg("r1"))
        await until(lambda: _is_set(frozen), timeout=5)
        got = await Streams(other_client, redis_prefix).read(
            "c-other", ["default"], count=8, block_ms=2000
        )
        assert [(d.message.run, d.peeked) for d in got] == [("r1", False)]
        reading.cancel()
    finally:
        never.set()
        await frozen_client.aclose()
        await other_client.aclose()


async def test_a_peek_answers_with_the_doorbells_entry_and_the_group_keeps_it(
    redis: Redis, redis_url: str, redis_prefix: str
) -> None:
    reader = Streams(redis, redis_prefix)
    await reader.ensure_groups(["default"])
    reading = asyncio.create_task(reader.read("c1", ["default"], count=8, block_ms=5000, peek=True))
    await asyncio.sleep(0.2)
    producer = connect(redis_url)
    try:
        entry = await Streams(producer, redis_prefix).publish("default", msg("r1"))
        got = await asyncio.wait_for(reading, 5)
    finally:
        await producer.aclose()
    assert [(d.message.run, d.entry_id, d.peeked) for d in got] == [("r1", entry, True)]
    # Nothing was taken: the group hands the same entry to the next reader, for its ack.
    assert (await reader.depth("default")).pending == 0
    again = await reader.read("c2", ["default"], count=8, block_ms=0)
    assert [(d.message.run, d.entry_id, d.peeked) for d in again] == [("r1", entry, False)]


async def test_a_peek_with_one_free_slot_takes_from_the_group(
    redis: Redis, redis_url: str, redis_prefix: str
) -> None:
    """With one slot, a doorbell that saw only normal-lane entries leaves the choice to
    the read script, which puts a recovery entry that arrived meanwhile first."""
    reader = Streams(redis, redis_prefix)
    await reader.ensure_groups(["default"])
    reading = asyncio.create_task(reader.read("c1", ["default"], count=1, block_ms=5000, peek=True))
    await asyncio.sleep(0.2)
    producer = connect(redis_url)
    try:
        await Streams(producer, redis_prefix).publish("default", msg("r1"))
        got = await asyncio.wait_for(reading, 5)
    finally:
        await producer.aclose()
    assert [(d.message.run, d.peeked) for d in got] == [("r1", False)]
    assert (await reader.depth("default")).pending == 1
