"""A read that emptied the streams lets the next idle read skip the script's empty answer.

When the read script delivered fewer entries than it was allowed, it had read every lane
with room to spare, atomically, so nothing up to the tails it answered is undelivered.
The next blocking ``Streams.read`` of the same streams by the same consumer goes straight
to the doorbell from those tails (one Redis round trip less per run for a worker that
serves one arrival at a time). Everything else is as before: an entry that arrived in
between rings the doorbell at once and the script takes it, recovery lanes first; a read
that filled its count, a read that must not block, and another consumer's or another
queue list's read all run the script first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runfleet.broker.codec import StreamMessage
from runfleet.broker.streams import Lane, Streams
from tests.support.polling import until


def msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "schedule", "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


class Sent:
    """The commands a ``Streams`` sends, by name (EVALSHA: the read script; ``warm`` has
    loaded it, so none is sent twice for a NOSCRIPT)."""

    def __init__(self, streams: Streams, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real: Any = streams._redis.execute_command

        async def execute(*args: Any, **options: Any) -> Any:
            name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            self.names.append(name.upper())
            return await real(*args, **options)

        monkeypatch.setattr(streams._redis, "execute_command", execute)

    def count(self, name: str) -> int:
        return self.names.count(name)

    async def blocked(self, n: int) -> bool:
        return self.count("XREAD") >= n


async def warm(streams: Streams) -> None:
    """The read script loaded (a non-blocking read of nothing, by nobody else)."""
    assert await streams.read("warm", ["default"], count=1, block_ms=0) == []


def runs(deliveries: list[Any]) -> list[str]:
    return [d.message.run for d in deliveries]


async def test_after_a_short_read_the_next_idle_read_waits_on_the_doorbell_at_once(
    streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    await streams.ensure_groups(["default"])
    await warm(streams)
    await streams.publish("default", msg("r1"))
    sent = Sent(streams, monkeypatch)
    assert runs(await streams.read("c1", ["default"], count=8, block_ms=2000)) == ["r1"]
    assert sent.count("EVALSHA") == 1
    reading = asyncio.create_task(streams.read("c1", ["default"], count=7, block_ms=5000))
    await until(lambda: sent.blocked(1), timeout=5)
    assert sent.count("EVALSHA") == 1, "the empty script read was not skipped"
    await streams.publish("default", msg("r2"))
    assert runs(await asyncio.wait_for(reading, 5)) == ["r2"]
    assert sent.count("EVALSHA") == 2  # the doorbell rang; the script took the entry


async def test_a_read_that_filled_its_count_reads_the_rest_first(
    streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry left undelivered before the tails would never ring the doorbell."""
    await streams.ensure_groups(["default"])
    await streams.publish_many([("default", msg(f"r{i}")) for i in range(3)])
    assert runs(await streams.read("c1", ["default"], count=2, block_ms=2000)) == ["r0", "r1"]
    sent = Sent(streams, monkeypatch)
    got = await streams.read("c1", ["default"], count=8, block_ms=5000)
    assert runs(got) == ["r2"]
    assert sent.count("XREAD") == 0, "it waited on the doorbell with an entry undelivered"


async def test_entries_that_arrived_in_between_are_taken_recovery_lane_first(
    streams: Streams,
) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish("default", msg("r1"))
    assert runs(await streams.read("c1", ["default"], count=8, block_ms=2000)) == ["r1"]
    await streams.publish("default", msg("normal"))
    await streams.publish("default", msg("recovered"), Lane.RECOVERY)
    got = await streams.read("c1", ["default"], count=1, block_ms=2000)
    assert [(d.message.run, d.lane) for d in got] == [("recovered", Lane.RECOVERY)]


async def test_a_read_that_must_not_block_runs_the_script(streams: Streams) -> None:
    await streams.ensure_groups(["default"])
    await streams.publish("default", msg("r1"))
    assert runs(await streams.read("c1", ["default"], count=8, block_ms=2000)) == ["r1"]
    await streams.publish("default", msg("r2"))
    assert runs(await streams.read("c1", ["default"], count=8, block_ms=0)) == ["r2"]


async def test_another_consumer_or_queue_list_runs_the_script_first(
    streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    await streams.ensure_groups(["a", "b"])
    await warm(streams)
    await streams.publish("a", msg("a1"))
    sent = Sent(streams, monkeypatch)
    assert runs(await streams.read("c1", ["a"], count=8, block_ms=2000)) == ["a1"]
    await streams.publish("b", msg("b1"))
    assert runs(await streams.read("c1", ["a", "b"], count=8, block_ms=2000)) == ["b1"]
    await streams.publish("a", msg("a2"))
    assert runs(await streams.read("c2", ["a", "b"], count=8, block_ms=2000)) == ["a2"]
    assert sent.count("EVALSHA") == 3
    assert sent.count("XREAD") == 0  # each found its entry with the script, no doorbell
