"""A throwaway Patroni cluster per test (etcd, a primary, a standby) and the ledger.

The cluster is killed by the test, so none is shared. The ledger of step executions
lives in the session's database on the shared server, which nothing here touches.
Patroni and etcd are Debian packages (``make ha``); without them the suite skips.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.servers.patroni import INSTALL_HINT, PatroniCluster, ha_binaries


@pytest.fixture
async def ha_ledger_url(database_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE ha_ledger (run_id text, step int, epoch int, what text, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
    return database_url


def _cluster(synchronous: bool) -> Iterator[PatroniCluster]:
    if ha_binaries() is None:
        pytest.skip(f"patroni/etcd not installed: {INSTALL_HINT}")
    with PatroniCluster(synchronous=synchronous) as cluster:
        yield cluster


@pytest.fixture
def sync_cluster() -> Iterator[PatroniCluster]:
    yield from _cluster(True)


@pytest.fixture
def async_cluster() -> Iterator[PatroniCluster]:
    yield from _cluster(False)
