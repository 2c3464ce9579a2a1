"""Servers the chaos tests may break, and a fleet that runs five-step flows on them.

Each test owns the server it breaks (throwaway, on its own port); the ledger of step
executions stays in the session's database, which nothing here touches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate


@pytest.fixture
async def ledger_url(database_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE chaos_ledger (run_id text, step int, epoch int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
    return database_url


@pytest.fixture
def own_postgres() -> Iterator[ThrowawayPostgres]:
    # Durable commits: a hard stop must not lose a commit a worker was told about.
    with ThrowawayPostgres(durable_commits=True) as server:
        yield server


@pytest.fixture
def own_redis() -> Iterator[ThrowawayRedis]:
    with ThrowawayRedis() as server:
        yield server


@pytest.fixture
async def pg_settings(
    settings: Settings, own_postgres: ThrowawayPostgres
) -> AsyncIterator[Settings]:
    """Settings whose runfleet database is the breakable server (Redis stays shared)."""
    await migrate(own_postgres.url)
    yield chaos_settings(settings, database_url=own_postgres.url)


def chaos_settings(settings: Settings, **update: object) -> Settings:
    """Lease timing that lets a 3 s outage lapse workers (the path under test)."""
    return settings.model_copy(
        update={"heartbeat_interval": 0.25, "stale_after": 2.0, "sweep_interval": 0.25, **update}
    )
