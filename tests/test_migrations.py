"""Migrations: together they build exactly the canonical schema, once, even when raced."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString

import psycopg

from runfleet.store.migrate import (
    MIGRATION_LOCK_KEY,
    canonical_schema,
    migrate,
    migrations,
    schema_version,
)
from tests.support.polling import until

NewDatabase = Callable[[], Awaitable[str]]  # the new_empty_database fixture

# How the schema looks to the catalog, one query per kind of object. Columns are compared
# by name, not position: ADD COLUMN appends, and no runfleet query depends on column order.
# The bookkeeping table exists only on the migrated side, so it is left out everywhere.
CATALOG: dict[str, LiteralString] = {
    "relations": """
        SELECT c.relname, c.relkind::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'runfleet' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND c.relname <> 'schema_migrations'
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'runfleet' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND a.attnum > 0 AND NOT a.attisdropped AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, con.conname, pg_get_constraintdef(con.oid)
        FROM pg_constraint con
        JOIN pg_class c ON c.oid = con.conrelid
        JOIN pg_namespace n ON n.oid = con.connamespace
        WHERE n.nspname = 'runfleet' AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'runfleet' AND tablename <> 'schema_migrations'
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'runfleet' AND p.prokind IN ('f', 'p')
        ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'runfleet' AND NOT t.tgisinternal
        ORDER BY 1, 2""",
    "enums": """
        SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
        FROM pg_type t
        JOIN pg_enum e ON e.enumtypid = t.oid
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'runfleet'
        GROUP BY 1 ORDER BY 1""",
}


async def describe(url: str) -> dict[str, list[tuple[Any, ...]]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        return {kind: await (await conn.execute(q)).fetchall() for kind, q in CATALOG.items()}


async def test_migrations_build_the_canonical_schema(new_empty_database: NewDatabase) -> None:
    migrated, canonical = await new_empty_database(), await new_empty_database()
    await migrate(migrated)
    async with await psycopg.AsyncConnection.connect(canonical, autocommit=True) as conn:
        await conn.execute(canonical_schema().encode())

    got, want = await describe(migrated), await describe(canonical)

    assert ("runs", "r") in want["relations"], "the catalog queries see nothing"
    for kind in CATALOG:
        assert got[kind] == want[kind], f"migrations and schema.sql differ in {kind}"


async def test_migrating_twice_applies_nothing_the_second_time(
    new_empty_database: NewDatabase,
) -> None:
    url = await new_empty_database()
    every = [m.version for m in migrations()]

    assert await migrate(url) == every
    assert await migrate(url) == []
    assert await schema_version(url) == every[-1]


async def test_concurrent_migrations_apply_each_version_once(
    new_empty_database: NewDatabase,
) -> None:
    url = await new_empty_database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as holder:
        # Hold the lock until both migrators queue on it, so they genuinely overlap.
        await holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        racers = [asyncio.create_task(migrate(url)) for _ in range(2)]

        async def both_waiting() -> bool:
            cur = await holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            row = await cur.fetchone()
            return row is not None and row[0] == 2

        await until(both_waiting, 10, "both migrators to queue on the advisory lock")
        assert not any(task.done() for task in racers)
        await holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        results = await asyncio.gather(*racers)

        every = [m.version for m in migrations()]
        assert sorted(results) == [[], every]
        cur = await holder.execute(
            "SELECT version, count(*) FROM runfleet.schema_migrations GROUP BY 1 ORDER BY 1"
        )
        assert await cur.fetchall() == [(v, 1) for v in every]
