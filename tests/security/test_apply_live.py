"""`runfleet roles --apply` against a live fleet: re-applying waits on no writer, and the
first apply (which moves every table's owner, one lock at a time) survives losing a
deadlock to a writer that holds two tables."""

from __future__ import annotations

import asyncio

import psycopg

from runfleet.store import roles
from tests.support.polling import until


async def _waiting_on_a_lock(url: str, marker: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (f"%{marker}%",),
        )
        row = await cur.fetchone()
        return bool(row and row[0])


async def test_reapplying_privileges_waits_on_no_writer(database_url: str) -> None:
    await roles.apply_privileges(database_url)  # ownership moves here, once
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        async with writer.transaction():
            await writer.execute(
                "LOCK TABLE runfleet.runs, runfleet.journal, runfleet.clocks IN ROW EXCLUSIVE MODE"
            )
            # An ALTER TABLE ... OWNER would queue behind this writer.
            await asyncio.wait_for(roles.apply_privileges(database_url), 10)


async def test_first_apply_retries_the_deadlock_it_loses_to_a_writer(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute("ALTER TABLE runfleet.journal OWNER TO CURRENT_USER")
        await admin.execute("ALTER TABLE runfleet.runs OWNER TO CURRENT_USER")
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        async with writer.transaction():
            # The writer holds runs; the apply takes journal (names in order), then waits
            # for runs; the writer then asks for journal: a cycle Postgres must break.
            await writer.execute("LOCK TABLE runfleet.runs IN ROW EXCLUSIVE MODE")
            applying = asyncio.create_task(roles.apply_privileges(database_url))
            await until(
                lambda: _waiting_on_a_lock(database_url, "ALTER SCHEMA runfleet OWNER"),
                15,
                "the apply to wait for the writer's table",
            )
            await writer.execute("LOCK TABLE runfleet.journal IN ROW EXCLUSIVE MODE")
        await asyncio.wait_for(applying, 30)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'runfleet' AND c.relkind = 'r'"
            " AND c.relowner <> 'runfleet_migrator'::regrole"
        )
        assert await cur.fetchone() == (0,)
