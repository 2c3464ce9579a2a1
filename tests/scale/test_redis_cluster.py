"""The fleet on a Redis Cluster: 3 masters with a replica each, one master killed mid-run.

With a ``redis+cluster://`` URL the broker uses redis-py's cluster client, and the prefix
must carry a hash tag (``{rf}``) so that every key of the fleet shares one slot: the read
script over a worker's streams and the multi-stream ``XREAD`` are then legal in a
cluster. Killing the master that serves that slot is the disruption that matters; the
cluster promotes its replica (node timeout 1 s) and the fleet must carry on: runs are
delayed at most, none lost, none settled twice, no recorded step executed again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from runfleet.broker.client import connect
from runfleet.broker.keys import Keys
from runfleet.broker.notify import Notifier
from runfleet.ops.cli.doctor import Doctor
from runfleet.ops.servers.redis import ThrowawayRedisCluster
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import Owner, RunStatus
from tests.chaos.conftest import chaos_settings
from tests.chaos.harness import assert_clean, run_scenario
from tests.fleet.procs import WorkerProc

PREFIX = "{rf}"
RUNS = 200


@pytest.fixture
def cluster() -> Iterator[ThrowawayRedisCluster]:
    with ThrowawayRedisCluster(masters=3, replicas=1) as server:
        yield server


def test_every_key_of_a_tagged_prefix_shares_one_slot() -> None:
    keys = Keys(PREFIX)
    owner = Owner(host_id="pod-7", pid=12, nonce="abc")
    names = [keys.stream("default"), keys.recovery_stream("default"), keys.stream("other"),
             keys.recovery_stream("a:b"), keys.alive(owner), keys.cancel_channel,
             keys.settled_channel]  # fmt: skip
    assert len({key_slot(name.encode()) for name in names}) == 1
    untagged = Keys("runfleet")
    assert key_slot(untagged.stream("a").encode()) != key_slot(untagged.stream("b").encode())


async def test_a_cluster_url_needs_a_tagged_prefix(settings: Settings) -> None:
    url = "redis+cluster://127.0.0.1:1/0"
    with pytest.raises(InvalidInput, match="hash tag"):
        connect(settings.model_copy(update={"redis_url": url, "redis_prefix": "runfleet"}))
    client = connect(settings.model_copy(update={"redis_url": url, "redis_prefix": PREFIX}))
    assert isinstance(client, RedisCluster)  # not connected yet: the seed is only a URL
    plain = connect(settings)
    assert not isinstance(plain, RedisCluster)
    await plain.aclose()


async def test_pubsub_and_liveness_through_the_cluster(
    settings: Settings, cluster: ThrowawayRedisCluster
) -> None:
    ours = settings.model_copy(update={"redis_url": cluster.url, "redis_prefix": PREFIX})
    publisher, subscriber = connect(ours), connect(ours)
    try:
        async with Notifier(subscriber, PREFIX).watch_settled("run-1") as watch:
            assert await Notifier(publisher, PREFIX).publish_settled("run-1", RunStatus.COMPLETED)
            notice = await watch.wait(5)
        assert notice is not None and notice.run_id == "run-1"
        async with Notifier(subscriber, PREFIX).watch_settled("run-3") as watch:
            batch = [("run-2", RunStatus.COMPLETED), ("run-3", RunStatus.FAILED)]
            assert await Notifier(publisher, PREFIX).publish_settled_many(batch)  # one script
            notice = await watch.wait(5)
        assert notice is not None and notice.run_id == "run-3"
    finally:
        await publisher.aclose()
        await subscriber.aclose()
    worker = WorkerProc(ours, flows="tests.chaos.flows", concurrency=2, chaos_ledger_url="")
    try:
        await worker.wait_started()
        view = await Doctor(ours, []).run()  # SCANs every master for liveness keys
        assert view.live_workers == 1, view.checks
    finally:
        worker.close()


@pytest.mark.chaos
async def test_a_subscription_comes_back_after_its_master_dies(
    settings: Settings, cluster: ThrowawayRedisCluster
) -> None:
    """The worker's cancel subscription lives on the master of the prefix's slot: when
    that master dies, ``listen`` must resubscribe (to the promoted replica)."""
    ours = settings.model_copy(update={"redis_url": cluster.url, "redis_prefix": PREFIX})
    listener, publisher = connect(ours), connect(ours)
    got: list[str] = []
    ready = asyncio.Event()

    async def listen() -> None:
        async for notice in Notifier(listener, PREFIX).listen("cancel", on_ready=ready.set):
            got.append(notice.run_id)

    task = asyncio.create_task(listen())
    try:
        await asyncio.wait_for(ready.wait(), 10)
        await asyncio.to_thread(cluster.kill_master_of, Keys(PREFIX).cancel_channel)
        deadline = asyncio.get_running_loop().time() + 30
        n = 0
        while not got:  # notices published while it was away are lost: publish until heard
            assert asyncio.get_running_loop().time() < deadline, "never resubscribed"
            n += 1
            await Notifier(publisher, PREFIX).publish_cancel(f"after-{n}")
            await asyncio.sleep(0.2)
        assert got[0].startswith("after-")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await listener.aclose()
        await publisher.aclose()


@pytest.mark.chaos
async def test_fleet_survives_the_master_of_its_slot_dying(
    settings: Settings, cluster: ThrowawayRedisCluster, own_ledger: str
) -> None:
    ours = chaos_settings(settings, redis_url=cluster.url, redis_prefix=PREFIX)
    seen: list[int] = []

    async def kill_master() -> None:
        victim = await asyncio.to_thread(cluster.kill_master_of, Keys(PREFIX).stream("default"))
        seen.append(victim.port)

    outcome = await run_scenario(ours, own_ledger, kill_master, runs=RUNS)
    assert_clean(outcome, RUNS)
    stream = Keys(PREFIX).stream("default")
    promoted = cluster.master_of(stream)
    assert len(seen) == 1 and promoted.port != seen[0]
    # The workers read from the cluster (their group lives on the promoted master), and
    # `runfleet doctor` talks to it too.
    node = redis.Redis(port=promoted.port)
    try:
        assert [g["name"] for g in node.xinfo_groups(stream)] == [b"workers"]
    finally:
        node.close()
    view = await Doctor(ours, ["default"]).run()
    status = {c.name: c.status for c in view.checks}
    # doctor read the lag from the promoted master; "warn" is its word for wake entries
    # left unread once the scenario's workers stopped (redundant hints a loaded machine
    # leaves behind), not a failure to reach the cluster
    assert status["redis"] == "ok" and status["lag default"] in ("ok", "warn"), view.checks
