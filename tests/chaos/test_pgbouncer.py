"""The 300 five-step flows with every runfleet connection through PgBouncer in
transaction mode (Debian's package, 1.18: no prepared statements across server
connections), while the pooler's server connections are terminated three times.

``RUNFLEET_PREPARE_THRESHOLD=none`` is the setting that makes it work; the first test
shows what happens without it.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from runfleet.ops.servers.postgres import ThrowawayPgBouncer, ThrowawayPostgres
from runfleet.store.config import Settings
from runfleet.store.db import connection_kwargs
from runfleet.store.migrate import migrate
from tests.chaos.conftest import chaos_settings
from tests.chaos.harness import assert_clean, run_scenario
from tests.chaos.test_postgres_chaos import terminate_backends

pytestmark = pytest.mark.chaos


@pytest.fixture
def bouncer(own_postgres: ThrowawayPostgres) -> Iterator[ThrowawayPgBouncer]:
    with ThrowawayPgBouncer(own_postgres) as server:
        yield server


def test_automatic_prepared_statements_break_behind_transaction_pooling(
    settings: Settings, bouncer: ThrowawayPgBouncer
) -> None:
    """Why the setting exists: psycopg's default prepares, and the pooler loses them."""
    if bouncer.version >= (1, 21):
        pytest.skip(f"PgBouncer {bouncer.version} tracks prepared statements itself")
    errors: list[str] = []
    for threshold in (5, None):
        kwargs = connection_kwargs(settings.model_copy(update={"prepare_threshold": threshold}))
        conns = [psycopg.connect(bouncer.url, **kwargs) for _ in range(3)]
        failed = 0
        for i in range(20):
            for conn in conns:
                try:
                    conn.execute("SELECT %(i)s::int", {"i": i})
                except psycopg.errors.DuplicatePreparedStatement:
                    failed += 1
                except psycopg.errors.InvalidSqlStatementName:
                    failed += 1
        for conn in conns:
            conn.close()
        errors.append(f"{threshold}:{'failed' if failed else 'ok'}")
    assert errors == ["5:failed", "None:ok"]


async def test_flows_through_pgbouncer_transaction_mode(
    settings: Settings,
    own_postgres: ThrowawayPostgres,
    bouncer: ThrowawayPgBouncer,
    ledger_url: str,
) -> None:
    await migrate(own_postgres.url)
    ours = chaos_settings(settings, database_url=bouncer.url, prepare_threshold=None)

    async def terminate() -> None:
        await terminate_backends(own_postgres.url)

    outcome = await run_scenario(ours, ledger_url, terminate, admin_url=own_postgres.url)
    assert_clean(outcome)
