"""Redis error replies are survived by the probe, the notification loops and publishes.

A private redis-server (``ThrowawayRedis``) is driven into the states a failover or
a full server produces: OOM (maxmemory reached, noeviction), READONLY (demoted to a
replica) and MASTERDOWN (a replica that refuses stale reads). Each broker call
either answers (a probe: "unknown"; a publish: ``False``) or raises a typed Redis
error where its contract says so (a key write); none raises anything else, and a
subscription stays alive through all of it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError, RedisError

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.broker.notify import Notifier, SubscriptionSignals
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.store.types import Owner
from tests.broker.conftest import closed_port
from tests.support.polling import until

pytestmark = pytest.mark.chaos

HB = 1_764_000_000_000


@pytest.fixture(scope="module")
def own_redis() -> Iterator[ThrowawayRedis]:
    with ThrowawayRedis() as server:
        yield server


@pytest.fixture
async def client(own_redis: ThrowawayRedis) -> AsyncIterator[Redis]:
    c = connect(own_redis.url)
    try:
        yield c
    finally:
        await config(c, "maxmemory", "0")
        await c.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
        await c.aclose()


async def config(c: Redis, name: str, value: str) -> None:
    await c.config_set(name, value)


async def test_oom_readonly_and_masterdown_never_escape_untyped(client: Redis) -> None:
    prefix = f"rft-{uuid.uuid4().hex[:8]}"
    live = Liveness(client, prefix, "this-host", heartbeat_interval=0.5)
    notifier = Notifier(client, prefix)
    owner = Owner("elsewhere", 4242, uuid.uuid4().hex[:12])
    await live.refresh(owner, HB, False)
    seen: list[str] = []
    signals = SubscriptionSignals()
    sub = notifier.subscription("cancel", lambda n: seen.append(n.run_id), signals=signals)
    sub.start()
    try:
        assert await sub.wait_ready(5.0)

        # OOM: writes are refused, reads and pub/sub go on.
        await config(client, "maxmemory-policy", "noeviction")
        await config(client, "maxmemory", "1")
        with pytest.raises(OutOfMemoryError):
            await live.refresh(owner, HB, False)
        probe = await live.probe(owner, HB)
        assert probe.vouches, probe  # the key is still there and consistent
        assert await notifier.publish_cancel("during-oom") is True
        await signals.handled.until(lambda n: n.run_id == "during-oom")
        await config(client, "maxmemory", "0")

        # READONLY: demoted to a replica of a master that is not there.
        await config(client, "replica-serve-stale-data", "yes")
        await client.execute_command("REPLICAOF", "127.0.0.1", str(closed_port()))  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
        with pytest.raises(ReadOnlyError):
            await live.refresh(owner, HB, False)
        assert (await live.probe(owner, HB)).detail["key"] in ("consistent", "absent")

        # MASTERDOWN: the replica refuses reads too; the probe cannot tell.
        await config(client, "replica-serve-stale-data", "no")
        probe = await live.probe(owner, HB)
        assert (probe.verdict, probe.detail["key"], probe.detail["redis"]) == (
            "unknown",
            "unverified",
            "error-reply",
        )
        assert "MasterDown" in str(probe.detail["error"])
        with pytest.raises(RedisError):
            await live.fleet()  # typed: the CLI prints one line

        # Through all of it the subscription lived (or came back) and delivers.
        await config(client, "replica-serve-stale-data", "yes")
        await client.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
        assert await sub.wait_ready(10.0)

        async def publish_and_look() -> list[str]:
            await notifier.publish_cancel("after")
            await asyncio.sleep(0.05)
            return seen

        await until(publish_and_look, timeout=10.0, accept=lambda s: "after" in s)
    finally:
        sub.stop()
        await sub.wait_stopped(1.0)
