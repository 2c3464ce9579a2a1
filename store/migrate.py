"""Numbered SQL migrations, applied in order under an advisory lock and recorded."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

# An arbitrary constant shared by every runfleet process: two workers starting at
# once must not both apply migration N.
MIGRATION_LOCK_KEY = 0x72756E666C656574  # "runfleet"

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found: list[Migration] = []
    for entry in resources.files("runfleet.store.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..N without gaps, found {versions}")
    return found


def canonical_schema() -> str:
    return resources.files("runfleet.store").joinpath("schema.sql").read_text()


async def migrate(conninfo: str) -> list[int]:
    """Apply every unapplied migration; return the versions applied by this call."""
    applied: list[int] = []
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            await conn.execute("CREATE SCHEMA IF NOT EXISTS runfleet")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS runfleet.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM runfleet.schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            for migration in migrations():
                if migration.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql.encode())
                    await conn.execute(
                        "INSERT INTO runfleet.schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied.append(migration.version)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied


async def schema_version(conninfo: str) -> int:
    """Highest applied migration, 0 for an empty database."""
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('runfleet.schema_migrations') IS NOT NULL")
        row = await cur.fetchone()
        if not row or not row[0]:
            return 0
        cur = await conn.execute("SELECT coalesce(max(version), 0) FROM runfleet.schema_migrations")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def migrate_blocking(conninfo: str) -> list[int]:
    return asyncio.run(migrate(conninfo))
