"""No producer or operator reads counters of the whole fleet.

Producers held USAGE on every sequence and read pg_stat_user_tables, so
``pg_sequences.last_value`` and the row counters told one tenant how busy every other
was. Now no scoped role holds a sequence privilege (the journal's seq is an identity),
and ``runfleet roles --apply`` run by a superuser takes the catalog's statistics views
and functions from PUBLIC in runfleet's database. What Postgres shows every role
whatever is done is listed in docs/explanation/trust-model.md: a test cannot hide it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import LiteralString

import psycopg
import pytest

from runfleet.producer import AsyncQueue
from runfleet.store import roles
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.roles import GroupRole
from tests.ops.conftest import cli_env, invoke
from tests.security.conftest import Login, MakeLogin

COUNTERS: dict[str, LiteralString] = {
    "a sequence": "SELECT last_value FROM runfleet.journal_seq_seq",
    "an edge sequence": "SELECT last_value FROM runfleet.run_parents_seq_seq",
    "nextval": "SELECT nextval('runfleet.journal_seq_seq')",
    "currval": "SELECT pg_sequence_last_value('runfleet.journal_seq_seq')",
    "table counters": "SELECT n_tup_ins, n_live_tup FROM pg_stat_user_tables",
    "all tables": "SELECT n_tup_upd FROM pg_stat_all_tables WHERE relname = 'runs'",
    "this transaction's": "SELECT n_tup_ins FROM pg_stat_xact_user_tables",
    "table io": "SELECT heap_blks_read FROM pg_statio_user_tables",
    "index scans": "SELECT idx_scan FROM pg_stat_user_indexes",
    "database totals": "SELECT xact_commit, tup_inserted FROM pg_stat_database",
    "a counter function": "SELECT pg_stat_get_tuples_inserted('runfleet.journal'::regclass)",
    "live rows": "SELECT pg_stat_get_live_tuples('runfleet.runs'::regclass)",
    "a table's size": "SELECT pg_relation_size('runfleet.journal')",
    "a total size": "SELECT pg_total_relation_size('runfleet.runs')",
    "the database's size": "SELECT pg_database_size(current_database())",
}


async def _read(who: Login, query: LiteralString) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
        return await (await conn.execute(query)).fetchall()


async def test_a_stock_database_shows_its_statistics_to_every_role(
    new_empty_database: Callable[[], Awaitable[str]],
) -> None:
    """Before a superuser applies the privileges, `runfleet roles` must say so."""
    url = await new_empty_database()
    await migrate(url)
    assert not (await roles.visibility(url)).statistics_hidden


async def test_scoped_roles_read_no_fleet_wide_counter(
    database_url: str, login: MakeLogin, settings: Settings
) -> None:
    producer = await login(GroupRole.PRODUCER, "s1")  # applied by the suite's superuser
    operator = await login(GroupRole.OPERATOR, "s1")
    fleet = await login(GroupRole.WORKER)
    other = await login(GroupRole.PRODUCER, "s2")
    async with AsyncQueue(
        "default", settings=other.settings, scopes=["s2"], late_binding=True
    ) as q:
        for n in range(20):
            await q.enqueue("sec.leaf", n, run_id=f"other-{n}")  # activity to count
    async with AsyncQueue(
        "default", settings=producer.settings, scopes=["s1"], late_binding=True
    ) as q:
        await q.enqueue("sec.leaf", 1, run_id="mine")  # its own admission needs no sequence

    for who in (producer, operator):
        for what, query in COUNTERS.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await _read(who, query)
                pytest.fail(f"{who.name} read {what}")
        rows = await _read(who, "SELECT last_value FROM pg_sequences WHERE schemaname = 'runfleet'")
        assert rows and all(value is None for (value,) in rows), rows
    # Workers see every run anyway, and monitoring (pg_read_all_stats) keeps its counters.
    ((seen,),) = await _read(fleet, "SELECT last_value FROM runfleet.journal_seq_seq")
    assert isinstance(seen, int) and seen > 0
    assert (await roles.visibility(database_url)).statistics_hidden

    shown = await invoke(
        cli_env(settings.model_copy(update={"database_url": database_url})), "roles"
    )
    assert shown.code == 0, shown
    assert "catalog statistics  hidden from producers and operators" in shown.stdout
    assert "max_payload_bytes=1000000" in shown.stdout
