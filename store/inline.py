"""The store driven in a blocking caller's own thread: the same code, a blocking driver.

A sync ``Queue`` call does not hop to an event-loop thread and back (two thread wake-ups
and an asyncio round per statement, about as much as the statement itself on a fast
database): the store's own ``async`` methods run over a blocking psycopg pool instead.
No method of ``InlineDatabase`` ever suspends, so a coroutine of the store (or of a
queue over it) runs to completion on its first step: ``drive`` takes that step in the
calling thread. The SQL, the rules and the outcome handling are the store's, unchanged
(STYLE rule 6); only how the driver is called differs.

A coroutine that does suspend awaited something a blocking driver cannot serve (a
subscription, a real asyncio primitive): ``drive`` closes it and raises ``Suspended``.
Nothing a driven call awaits does that; the test suite proves it for every driven call.
Retry backoff sleeps the calling thread (``store.transient.pause``), as a blocking
client would.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Self, TypeVar

import psycopg
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.db import (
    CHECK_AFTER_IDLE_S,
    OPTIONS_REFUSED,
    RECONNECT_GIVE_UP_S,
    Database,
    _without_options,
    connection_kwargs,
    default_source_id,
    refuses_options,
)
from runfleet.store.queries import q
from runfleet.store.reach import producer_pool_name
from runfleet.store.transient import blocking_caller, end_blocking_caller

log = logging.getLogger("runfleet.store.inline")
T = TypeVar("T")
BlockingConn = psycopg.Connection[DictRow]


class Suspended(RuntimeError):
    """A driven coroutine awaited something only an event loop serves (a bug of the caller)."""


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``, which must never suspend, to completion in this thread."""
    token = blocking_caller()
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # StopIteration.value is Any
    finally:
        end_blocking_caller(token)
    coro.close()
    name = getattr(coro, "__qualname__", repr(coro))
    raise Suspended(f"{name} awaited an event loop; it cannot be driven inline")


class InlineDatabase(Database):
    """``Database`` over a blocking pool: every method completes without suspending."""

    @property
    def shares_reads(self) -> bool:
        """Never: a blocking caller's coroutine must not suspend, so its reads are its own."""
        return False

    def __init__(self, pool: ConnectionPool[BlockingConn], source_id: str) -> None:
        # Not Database.__init__: its pool is an asyncio one. The journal address space
        # is this object's own (a separate source id), so it never shares a counter.
        self.blocking_pool = pool
        self.source_id = source_id
        self._seq = itertools.count(1)
        self._inline_current: contextvars.ContextVar[BlockingConn | None] = contextvars.ContextVar(
            f"runfleet_inline_tx_{id(self)}", default=None
        )

    @property
    def pool_name(self) -> str:
        return self.blocking_pool.name

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        # The block's connection is the blocking one; no store code uses what it yields.
        current = self._inline_current.get()
        if current is not None:
            with current.transaction():
                yield current
            return
        with self._checkout() as conn:
            with conn.transaction():
                token = self._inline_current.set(conn)
                try:
                    yield conn
                finally:
                    self._inline_current.reset(token)

    @contextmanager
    def _conn(self) -> Iterator[BlockingConn]:
        current = self._inline_current.get()
        if current is not None:
            yield current
            return
        with self._checkout() as conn:
            yield conn

    @contextmanager
    def _checkout(self) -> Iterator[BlockingConn]:
        """A pooled connection, stamped as answering when this thread is done with it.

        The stamp is what ``_check_if_idle`` reads. It is taken here, in the caller's
        thread, and not by a pool ``reset`` callback: a pool with ``reset`` hands every
        returned connection to its worker thread, so the next checkout waited for that
        thread to wake and put the connection back (a thread hop per statement, which the
        inline face exists to avoid; docs/explanation/admission-path.md).
        """
        with self.blocking_pool.connection() as conn:
            try:
                with _discard_if_desynced(conn):
                    yield conn
            finally:
                _returned_at[conn] = time.monotonic()

    async def one(self, name: str, params: dict[str, Any] | None = None) -> DictRow | None:
        with self._conn() as conn:
            return conn.execute(q(name), params or {}).fetchone()

    async def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        with self._conn() as conn:
            return conn.execute(q(name), params or {}).rowcount

    async def many(self, name: str, params_seq: Sequence[dict[str, Any]]) -> list[DictRow | None]:
        if not params_seq:
            return []
        with self._conn() as conn:
            cur = conn.cursor()
            cur.executemany(q(name), params_seq, returning=True)
            rows: list[DictRow | None] = []
            while True:
                rows.append(cur.fetchone())
                if not cur.nextset():
                    return rows

    async def pipelined(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[DictRow]]:
        with self._conn() as conn:
            with conn.pipeline():
                cursors = [conn.execute(q(name), params) for name, params in statements]
            return [cur.fetchall() for cur in cursors]

    async def all(self, name: str, params: dict[str, Any] | None = None) -> list[DictRow]:
        with self._conn() as conn:
            return conn.execute(q(name), params or {}).fetchall()


@contextmanager
def _discard_if_desynced(conn: BlockingConn) -> Iterator[None]:
    """``store.db._discard_if_desynced`` for a blocking connection (see there why)."""
    try:
        yield
    except psycopg.InternalError as exc:
        if exc.sqlstate is None:
            conn.close()
        raise


class _Connection(psycopg.Connection[DictRow]):
    """The blocking pool's connections, with ``store.db.connect``'s ``options`` fallback."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        if "options" in kwargs and conninfo in _without_options:
            kwargs = {k: v for k, v in kwargs.items() if k != "options"}
        try:
            return super().connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            if "options" not in kwargs or not refuses_options(exc):
                raise
            if conninfo not in _without_options:
                _without_options.add(conninfo)
                log.warning(OPTIONS_REFUSED, extra={"error": str(exc).strip().splitlines()[-1]})
        kwargs = {k: v for k, v in kwargs.items() if k != "options"}
        return super().connect(conninfo, **kwargs)


_returned_at: weakref.WeakKeyDictionary[BlockingConn, float] = weakref.WeakKeyDictionary()


def _check_if_idle(conn: BlockingConn) -> None:
    """``store.db._check_if_idle``: probe only a connection idle past ``CHECK_AFTER_IDLE_S``."""
    returned = _returned_at.get(conn)
    if returned is None or time.monotonic() - returned > CHECK_AFTER_IDLE_S:
        ConnectionPool.check_connection(conn)


def open_store(settings: Settings, *, checkout_timeout: float) -> Store:
    """A ``Store`` over a blocking pool (opened lazily: the first call connects)."""
    pool: ConnectionPool[BlockingConn] = ConnectionPool(
        settings.database_url,
        min_size=1,
        max_size=settings.pool_max,
        kwargs=connection_kwargs(settings),
        connection_class=_Connection,
        check=_check_if_idle,  # no reset=: the stamp is InlineDatabase._checkout's
        open=False,
        timeout=checkout_timeout,
        reconnect_timeout=RECONNECT_GIVE_UP_S,
        name=producer_pool_name(),
    )
    pool.open(wait=False)
    return Store(InlineDatabase(pool, default_source_id()), settings)


def close_store(store: Store) -> None:
    db = store.db
    if isinstance(db, InlineDatabase):
        with contextlib.suppress(Exception):
            db.blocking_pool.close(timeout=5)
