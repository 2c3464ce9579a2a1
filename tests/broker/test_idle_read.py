"""An idle reader takes the first entry with its wake: one Redis round trip after publish.

With a free slot per stream, ``Streams.read`` blocks in ``XREADGROUP`` itself (one entry
per stream at most, so never more than the free slots) instead of a non-consuming
``XREAD`` doorbell followed by the read script. Recovery lanes stay first; with fewer
free slots than streams the doorbell is kept, so ``count`` still bounds every read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.codec import StreamMessage
from runfleet.broker.streams import Lane, Streams
from tests.support.polling import until


def msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "schedule", "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


class Recorded:
    """Every command the reader's client sent, by name (scripts as EVALSHA)."""

    def __init__(self, redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real: Any = redis.execute_command

        async def execute(*args: Any, **options: Any) -> Any:
            self.names.append(str(args[0]).upper())
            return await real(*args, **options)

        monkeypatch.setattr(redis, "execute_command", execute)


async def test_an_idle_read_is_woken_with_the_entry(
    redis: Redis, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = Streams(redis, redis_prefix)
    await reader.ensure_groups(["default"])
    sent = Recorded(redis, monkeypatch)
    reading = asyncio.create_task(reader.read("c1", ["default"], count=8, block_ms=5000))

    async def blocked() -> bool:
        return "XREADGROUP" in sent.names

    await until(blocked, timeout=5)
    assert "XREAD" not in sent.names  # no doorbell
    before = len(sent.names)
    producer = connect(redis_url)
    try:
        await Streams(producer, redis_prefix).publish("default", msg("r1"))
        got = await asyncio.wait_for(reading, 5)
    finally:
        await producer.aclose()
    assert [d.message.run for d in got] == ["r1"]
    assert sent.names[before:] == [], "the wake itself delivered the entry"


async def test_the_wake_takes_recovery_first_and_at_most_one_per_stream(
    streams: Streams,
) -> None:
    await streams.ensure_groups(["a", "b"])
    await streams.publish("b", msg("b-normal-1"))
    await streams.publish("b", msg("b-normal-2"))
    await streams.publish("a", msg("a-normal"))
    await streams.publish("b", msg("b-recovery"), Lane.RECOVERY)
    ordered = [(q, lane) for lane in Lane for q in ("a", "b")]
    keys = [streams.stream_key(q, lane) for q, lane in ordered]
    taken = await streams._wait_and_take("c1", ordered, keys, 100)
    assert [(q, lane) for q, lane, _id, _f in taken] == [
        ("b", Lane.RECOVERY),
        ("a", Lane.NORMAL),
        ("b", Lane.NORMAL),
    ]
    rest = await streams.read("c1", ["a", "b"], count=8, block_ms=0)
    assert [d.message.run for d in rest] == ["b-normal-2"]


async def test_fewer_free_slots_than_streams_keep_the_doorbell(
    redis: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = Streams(redis, redis_prefix)
    await reader.ensure_groups(["a", "b"])  # four streams, one free slot
    sent = Recorded(redis, monkeypatch)
    got = await reader.read("c1", ["a", "b"], count=1, block_ms=50)
    assert got == []
    assert "XREAD" in sent.names and "XREADGROUP" not in sent.names
