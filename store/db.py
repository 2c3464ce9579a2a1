"""The connection pool and the one transaction boundary every store operation shares.

``Store.transaction()`` opens a transaction, or a savepoint when one is already
open in this task, so a CAS and its journal record always commit together — and
a caller can make several operations atomic by wrapping them in one block.
"""

from __future__ import annotations

import contextvars
import itertools
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from store.config import Settings
from store.queries import q

Conn = AsyncConnection[DictRow]


class Database:
    """A psycopg async pool plus the task-local current transaction."""

    def __init__(self, pool: AsyncConnectionPool[Conn], source_id: str) -> None:
        self.pool = pool
        self.source_id = source_id
        """Journal address space of this process: records it writes are (source_id, n)."""
        self._seq = itertools.count(1)
        self._current: contextvars.ContextVar[Conn | None] = contextvars.ContextVar(
            f"runfleet_tx_{id(self)}", default=None
        )

    def next_source_seq(self) -> int:
        return next(self._seq)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        current = self._current.get()
        if current is not None:
            async with current.transaction():
                yield current
            return
        async with self.pool.connection() as conn, conn.transaction():
            token = self._current.set(conn)
            try:
                yield conn
            finally:
                self._current.reset(token)

    async def one(self, name: str, params: dict[str, Any] | None = None) -> DictRow | None:
        async with self.transaction() as conn:
            cur = await conn.execute(q(name), params or {})
            return await cur.fetchone()

    async def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """Run a statement for its effect; the number of rows it touched."""
        async with self.transaction() as conn:
            cur = await conn.execute(q(name), params or {})
            return cur.rowcount

    async def all(self, name: str, params: dict[str, Any] | None = None) -> list[DictRow]:
        async with self.transaction() as conn:
            cur = await conn.execute(q(name), params or {})
            return await cur.fetchall()


async def open_pool(
    settings: Settings, *, min_size: int | None = None, max_size: int | None = None
) -> AsyncConnectionPool[Conn]:
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        settings.database_url,
        min_size=min_size or settings.pool_min,
        max_size=max_size or settings.pool_max,
        kwargs={"autocommit": True, "row_factory": dict_row},
        connection_class=AsyncConnection[DictRow],
        check=AsyncConnectionPool.check_connection,
        open=False,
        name="runfleet",
    )
    await pool.open(wait=True, timeout=30)
    return pool


def default_source_id() -> str:
    """A producer's journal address space: unique per process start."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
