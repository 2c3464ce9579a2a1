"""Fixtures of the partition suite: namespaces, servers on bridge addresses, a cluster.

The topology and the two servers are built once per module (a few seconds); each
scenario gets a fresh database cloned from a migrated template, its own Redis prefix,
its own ledger file and its own worker processes. Teardown heals every link, kills
every worker group, drops the database and removes namespaces, veths and bridges even
when a scenario fails or times out.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from runfleet.ops.servers.resolve import database_url_for
from runfleet.ops.servers.throwaway import ServicesUnavailable
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.partition.cluster import Cluster, timing
from tests.partition.net import Topology, TopologyUnavailable, topology, unavailable_reason
from tests.partition.servers import BridgePostgres, BridgeRedis

Servers = tuple[BridgePostgres, BridgeRedis]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "partition: cuts network links between simulated hosts")


@pytest.fixture(scope="module")
def net() -> Iterator[Topology]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"partition suite: {reason}")
    try:
        with topology(["a", "b"]) as topo:
            yield topo
    except TopologyUnavailable as exc:
        pytest.skip(f"partition suite: {exc}")


@pytest.fixture(scope="module")
def bridge_servers(net: Topology) -> Iterator[Servers]:
    if shutil.which("redis-server") is None:
        pytest.skip("partition suite: redis-server is not installed")
    try:
        postgres = BridgePostgres(net.postgres_address)
    except ServicesUnavailable as exc:
        pytest.skip(f"partition suite: {exc}")
    with postgres, BridgeRedis(net.redis_address) as redis:
        yield postgres, redis


async def _admin(admin_url: str, statement: sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(statement)


@pytest.fixture(scope="module")
async def partition_template(bridge_servers: Servers) -> str:
    postgres, _ = bridge_servers
    name = f"rf_ptpl_{uuid.uuid4().hex[:8]}"
    await _admin(postgres.url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    await migrate(database_url_for(postgres.url, name))
    return name  # the server (and the template with it) goes at module end


@pytest.fixture
async def cluster(
    net: Topology, bridge_servers: Servers, partition_template: str, tmp_path: Path
) -> AsyncIterator[Cluster]:
    postgres, redis = bridge_servers
    name = f"rf_p_{uuid.uuid4().hex[:12]}"
    await _admin(
        postgres.url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(partition_template)
        ),
    )
    settings = timing(
        Settings(
            database_url=database_url_for(postgres.url, name),
            redis_url=redis.url,
            redis_prefix=f"rfp-{uuid.uuid4().hex[:8]}",
        )
    )
    store = await Store.open(settings)
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch(mode=0o666)
    built = Cluster(net, settings, store, ledger)
    try:
        await built.start()
        yield built
    finally:
        built.close()
        await store.close()
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        await _admin(postgres.url, drop)
