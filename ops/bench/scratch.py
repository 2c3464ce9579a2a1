"""Where a benchmark runs: the server it was pointed at, and a database of its own there.

The URL comes from ``--database-url``, else ``RUNFLEET_DATABASE_URL``, else
``ops.servers.resolve.resolve("app")`` (which may start throwaway servers, stopped afterwards).
The scratch database is dropped even when the benchmark fails half-way.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo


class BenchError(RuntimeError):
    """The benchmark cannot run (no server, no rights) or its work went wrong."""


@contextmanager
def server_url(explicit: str | None) -> Iterator[str]:
    """An admin URL (CREATEDB rights) for the server to benchmark."""
    url = explicit or os.environ.get("RUNFLEET_DATABASE_URL")
    if url:
        yield url
        return
    try:
        from runfleet.ops.servers.resolve import resolve
    except ImportError as exc:
        raise BenchError(
            "no database: pass --database-url or set RUNFLEET_DATABASE_URL "
            f"(runfleet.ops.servers.resolve, which could start one, is unavailable: {exc})"
        ) from exc
    endpoints = resolve("app")
    try:
        yield endpoints.database_url
    finally:
        endpoints.close()


@asynccontextmanager
async def scratch_database(admin_url: str, prefix: str = "rf_bench") -> AsyncIterator[str]:
    """Create ``<prefix>_<random>`` on the server, yield its URL, drop it afterwards."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    try:
        async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BenchError(f"cannot create database {name}: {exc}") from exc
    try:
        yield make_conninfo(admin_url, dbname=name)
    finally:
        # FORCE: a benchmark that failed mid-way may leave pooled connections open.
        async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
