"""The connection pool and the one transaction boundary every store operation shares.

``Store.transaction()`` opens a transaction, or a savepoint when one is already
open in this task, so a CAS and its journal record always commit together — and
a caller can make several operations atomic by wrapping them in one block.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
import secrets
import socket
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.adapt import AdaptersMap
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from runfleet.store.config import Settings
from runfleet.store.queries import q
from runfleet.store.urls import require
from runfleet.store.values import Undecodable

Conn = AsyncConnection[DictRow]

LockWaitEnded = psycopg.errors.LockNotAvailable
"""What a statement raises when a lock it waited for stayed held past ``lock_timeout``
(SQLSTATE 55P03): on a worker's connections, ``Settings.worker_lock_wait_ms``. The row
writes a worker makes on one run answer it as ``RowLocked`` (that run is set aside);
anywhere else it is transient (``store.transient``): the same call later may succeed."""

log = logging.getLogger("runfleet.store.db")
C = TypeVar("C", bound=AsyncConnection[DictRow])


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

    @property
    def pool_name(self) -> str:
        """The pool's name in psycopg_pool's log lines (``store.reach``)."""
        return self.pool.name

    @property
    def shares_reads(self) -> bool:
        """Whether a read of this task may join other tasks' reads in one statement: not
        inside this task's transaction (its reads are that transaction's)."""
        return self._current.get() is None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        current = self._current.get()
        if current is not None:
            async with current.transaction():
                yield current
            return
        async with self._pooled() as conn, conn.transaction():
            token = self._current.set(conn)
            try:
                yield conn
            finally:
                self._current.reset(token)

    @asynccontextmanager
    async def _statement(self) -> AsyncIterator[Conn]:
        """The connection for one statement: the open transaction's, else a pooled one.

        No savepoint and no BEGIN/COMMIT around a single statement: it is atomic on its
        own (the pool's connections autocommit), and inside a transaction a failing
        statement propagates and rolls the whole block back anyway. The wrappers cost
        two or three extra round trips per statement, which dominated the fast path.
        """
        current = self._current.get()
        if current is not None:
            yield current
            return
        async with self._pooled() as conn:
            yield conn

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[Conn]:
        """A pooled connection, handed back by this task as the block ends, stamped for
        ``_check_if_idle`` (no pool ``reset`` callback, which would return every connection
        through a pool worker task: a queue hop and a task switch per statement).

        A connection that comes back mid-operation or mid-transaction (a cancelled
        statement or commit) is rolled back or closed by the pool on return, which waits
        on the server. That return runs shielded and held (``_returning``): a cancel of
        this task, arriving during the rollback, would otherwise be caught by the pool,
        which closes the connection, opens another and swallows the cancel (and arriving
        as the pool takes the connection back, could lose it).
        """
        conn = await self.pool.getconn()
        try:
            async with _discard_if_desynced(conn):
                yield conn
        finally:
            _returned_at[conn] = time.monotonic()
            if conn.pgconn.transaction_status == TransactionStatus.IDLE:
                await self.pool.putconn(conn)
            else:
                returning = asyncio.ensure_future(self.pool.putconn(conn))
                _returning.add(returning)  # held until done: a cancel leaves it unawaited
                returning.add_done_callback(_returning.discard)
                await asyncio.shield(returning)

    async def one(self, name: str, params: dict[str, Any] | None = None) -> DictRow | None:
        async with self._statement() as conn:
            cur = await conn.execute(q(name), params or {})
            return await cur.fetchone()

    async def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """Run a statement for its effect; the number of rows it touched."""
        async with self._statement() as conn:
            cur = await conn.execute(q(name), params or {})
            return cur.rowcount

    async def many(self, name: str, params_seq: Sequence[dict[str, Any]]) -> list[DictRow | None]:
        """Run one statement once per parameter set, pipelined; each run's first row or None.

        One network round for the whole batch instead of one per execution.
        """
        if not params_seq:
            return []
        async with self._statement() as conn:
            cur = conn.cursor()
            await cur.executemany(q(name), params_seq, returning=True)
            rows: list[DictRow | None] = []
            while True:
                rows.append(await cur.fetchone())
                if not cur.nextset():
                    return rows

    async def pipelined(
        self, statements: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[DictRow]]:
        """Run named statements in one round trip (psycopg's pipeline mode) on one
        connection, the open transaction's else a pooled one; each one's rows, in order.

        Outside a transaction they are one implicit transaction (a single Sync ends the
        pipeline): all commit or none do, with no BEGIN/COMMIT round trips.
        """
        async with self._statement() as conn:
            async with conn.pipeline():
                cursors = [await conn.execute(q(name), params) for name, params in statements]
            return [await cur.fetchall() for cur in cursors]

    async def all(self, name: str, params: dict[str, Any] | None = None) -> list[DictRow]:
        async with self._statement() as conn:
            cur = await conn.execute(q(name), params or {})
            return await cur.fetchall()


@asynccontextmanager
async def _discard_if_desynced(conn: Conn) -> AsyncIterator[None]:
    """Close a connection whose protocol state psycopg lost track of, so the pool drops it.

    Seen behind PgBouncer when a server connection dies mid-transaction: psycopg
    reports ``received 2 results from command 'COMMIT'`` (an ``InternalError`` of its
    own, no SQLSTATE) and the connection would go back to the pool looking healthy.
    """
    try:
        yield
    except psycopg.InternalError as exc:
        if exc.sqlstate is None:
            await conn.close()
        raise


async def open_pool(
    settings: Settings,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
    statement_timeout_ms: int | None = None,
    lock_timeout_ms: int | None = None,
    checkout_timeout: float = 30.0,
    name: str = "runfleet",
    open_timeout: float = 30.0,
) -> AsyncConnectionPool[Conn]:
    """The store's pool; every connection gets ``connection_kwargs`` (timeouts, prepare).

    ``statement_timeout_ms`` overrides ``RUNFLEET_STATEMENT_TIMEOUT`` for this pool (a
    heartbeat pool wants a renewal to fail in under a second, not in thirty);
    ``lock_timeout_ms`` bounds every lock wait of this pool's statements (a worker's:
    ``Settings.worker_lock_wait_ms``; None: no bound, Postgres's default).
    ``checkout_timeout`` bounds the wait for a free (or re-established) connection:
    a producer with a 10 s retry budget must not sit 30 s in one checkout, nor
    ``open_timeout`` s for its first connection.
    """
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        require(settings.database_url, "database"),
        min_size=min_size or settings.pool_min,
        max_size=max_size or settings.pool_max,
        kwargs=connection_kwargs(
            settings, statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms
        ),
        connection_class=_Connection,
        check=_check_if_idle,
        open=False,
        timeout=checkout_timeout,
        reconnect_timeout=RECONNECT_GIVE_UP_S,
        reconnect_failed=_reconnect_again,
        name=name,
    )
    await pool.open(wait=True, timeout=open_timeout)
    return pool


OPTIONS_REFUSED = "postgres.startup_options_refused"
"""The log event of a server (a pooler) refusing the startup parameter ``options``."""

_REFUSES_OPTIONS = ("unsupported startup parameter",)
"""What PgBouncer answers a startup parameter it does not list in
``ignore_startup_parameters`` (``unsupported startup parameter: options``; newer
versions: ``unsupported startup parameter in options: ...``)."""

_without_options: set[str] = set()
"""Conninfos whose server refused ``options``: this process connects to them without it."""


def refuses_options(exc: BaseException) -> bool:
    """Whether a failed connection attempt was the server refusing the ``options``
    startup parameter (a stock PgBouncer), not trouble a retry could mend."""
    text = str(exc)
    return isinstance(exc, psycopg.OperationalError) and any(m in text for m in _REFUSES_OPTIONS)


async def connect(conninfo: str, **kwargs: Any) -> Conn:
    """``AsyncConnection.connect`` that survives a pooler refusing the startup ``options``.

    runfleet's server-side timeouts travel as ``options`` (``connection_kwargs``). A
    PgBouncer that does not list it in ``ignore_startup_parameters`` refuses every such
    connection, and a pool retrying forever made workers exit and producers wait 30 s.
    So the first refusal is logged once per conninfo, with both fixes, and this process
    connects without the parameter from then on: it works, with Postgres applying none
    of runfleet's timeouts (exactly as behind a PgBouncer that ignores ``options``). A
    ``SET`` after connecting is no substitute: in transaction mode it would land on
    whichever server connection ran it and stay there for the next client.
    """
    return await _without_refused_options(AsyncConnection[DictRow].connect, conninfo, kwargs)


async def _without_refused_options(
    open_: Callable[..., Awaitable[C]], conninfo: str, kwargs: dict[str, Any]
) -> C:
    """``open_(conninfo, **kwargs)``, dropping ``options`` where the server refuses it."""
    if "options" in kwargs and conninfo in _without_options:
        kwargs = {k: v for k, v in kwargs.items() if k != "options"}
    try:
        return await open_(conninfo, **kwargs)
    except psycopg.OperationalError as exc:
        if "options" not in kwargs or not refuses_options(exc):
            raise
        if conninfo not in _without_options:
            _without_options.add(conninfo)
            log.warning(
                OPTIONS_REFUSED,
                extra={
                    "error": str(exc).strip().splitlines()[-1],
                    "consequence": "connecting without it: Postgres applies no"
                    " statement_timeout or idle_in_transaction_session_timeout to runfleet's"
                    " sessions (the lease's server-side bound is off too)",
                    "fix": "list `options` in PgBouncer's ignore_startup_parameters and set its"
                    " query_timeout / idle_transaction_timeout, or set"
                    " RUNFLEET_STATEMENT_TIMEOUT=0 and RUNFLEET_IDLE_IN_TRANSACTION_TIMEOUT=0"
                    " so that runfleet sends no options",
                },
            )
    kwargs = {k: v for k, v in kwargs.items() if k != "options"}
    return await open_(conninfo, **kwargs)


def options_refused(conninfo: str) -> bool:
    """Whether this process found the server at ``conninfo`` refusing ``options``."""
    return conninfo in _without_options


class _Connection(AsyncConnection[DictRow]):
    """The pool's connections: opened with the ``options`` fallback of ``connect``."""

    @classmethod
    async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        return await _without_refused_options(super().connect, conninfo, kwargs)


_DECODER = json.JSONDecoder()


def load_json(data: str | bytes) -> Any:
    """``json.loads`` of a json/jsonb value as Postgres sends it, minus its per-call overhead.

    The same value for every input: Postgres sends UTF-8 (so no encoding to detect: that
    alone was a third of each load, eight loads per run) and a value whose text is not
    exactly one JSON document (whitespace around a ``json`` column's text, or not JSON)
    goes to ``json.loads`` itself, which answers or raises as it always did. A value
    nested deeper than Python decodes comes back as an ``Undecodable`` text.
    """
    text = data if isinstance(data, str) else data.decode("utf-8", "surrogatepass")
    try:
        try:
            value, end = _DECODER.raw_decode(text)
        except ValueError:
            return json.loads(text)
        return value if end == len(text) else json.loads(text)
    except RecursionError as exc:  # valid JSON to Postgres, too deep for Python: one row
        return Undecodable.of(text, exc)  # must not take every reader of it down


ADAPTERS = AdaptersMap(psycopg.adapters)
"""The adapters every store connection starts from: psycopg's, with ``load_json``."""
set_json_loads(load_json, ADAPTERS)


def connection_kwargs(
    settings: Settings,
    *,
    statement_timeout_ms: int | None = None,
    lock_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """psycopg/libpq arguments for every connection the store opens.

    The server-side timeouts travel as the startup parameter ``options`` (``-c
    statement_timeout=...``), so they hold from the first statement with no extra
    round trip. PgBouncer refuses unknown startup parameters: behind it either list
    ``options`` in its ``ignore_startup_parameters`` (the timeouts are then not applied
    by Postgres: use PgBouncer's ``query_timeout``/``idle_transaction_timeout`` or
    ``ALTER ROLE ... SET``), or set both timeouts to 0 so no ``options`` is sent; a
    stock PgBouncer makes ``connect`` fall back to connecting without it, with a
    warning. A ``SET`` per connection would not work there: in transaction mode it
    lands on whichever server connection runs it and leaks to other clients.
    ``tcp_user_timeout`` and keepalives make a silently dropped connection fail within
    seconds instead of the kernel's minutes. ``lock_timeout_ms`` travels the same way:
    a worker's pools bound every lock wait (``Settings.worker_lock_wait_ms``), so no
    lock a tenant's login can take holds one of its statements for longer.
    """
    statement_ms = (
        statement_timeout_ms
        if statement_timeout_ms is not None
        else int(settings.statement_timeout * 1000)
    )
    idle_ms = int(settings.idle_in_transaction_timeout * 1000)
    pairs = [
        (name, str(value))
        for name, value in (
            ("statement_timeout", statement_ms),
            ("idle_in_transaction_session_timeout", idle_ms),
            ("lock_timeout", lock_timeout_ms or 0),
        )
        if value > 0
    ]
    if pairs:  # ``options`` is sent only with timeouts in it (PgBouncer, above)
        # JIT off: runfleet's statements are short index lookups whose estimated cost
        # grows with the table (a 100,000-run backlog, statistics stale after a bulk
        # admission) past jit_above_cost, and then every settle paid a multi-second
        # compile for a 70 ms statement (docs/explanation/backlogs.md).
        pairs.append(("jit", "off"))
    options = " ".join(f"-c {name}={value}" for name, value in pairs)
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "context": ADAPTERS,
        "row_factory": dict_row,
        "prepare_threshold": settings.prepare_threshold,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }
    if settings.connect_timeout > 0:
        kwargs["connect_timeout"] = max(2, round(settings.connect_timeout))  # libpq: >= 2 s
    if settings.tcp_user_timeout > 0:
        kwargs["tcp_user_timeout"] = int(settings.tcp_user_timeout * 1000)
    if options:
        kwargs["options"] = options
    return kwargs


RECONNECT_GIVE_UP_S = 3.0
"""How long the pool's own background reconnection backs off before giving up.

psycopg_pool doubles its delay between attempts without bound (1, 2, 4, 8 s...), so
after a ten-second outage the next attempt could be 16 s away and every caller waits
for it. Given up early, the attempt is restarted at once (``_reconnect_again``):
recovery follows the server, not an old backoff.
"""

_pokes: set[asyncio.Task[None]] = set()


def _reconnect_again(pool: AsyncConnectionPool[Any]) -> None:
    """The pool gave up reconnecting: start afresh with one checkout of its own.

    A caller already waiting does not restart the pool's growth (only a new checkout
    does), so without this it would sit out its whole checkout timeout.
    """
    if pool.closed:
        return

    async def poke() -> None:
        with contextlib.suppress(Exception):
            async with pool.connection(timeout=RECONNECT_GIVE_UP_S * 2):
                pass

    task = asyncio.get_running_loop().create_task(poke())
    _pokes.add(task)
    task.add_done_callback(_pokes.discard)


CHECK_AFTER_IDLE_S = 0.5
"""A pooled connection idle longer than this is probed before it is handed out."""

_returned_at: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
"""When each connection was last handed back (``Database._pooled``)."""

_returning: set[asyncio.Future[None]] = set()
"""Shielded returns in flight (``Database._pooled``): the event loop keeps only a weak
reference to a task, so one whose caller was cancelled is held here until it is done."""


async def _check_if_idle(conn: Conn) -> None:
    """Probe a connection before reuse, unless it was back in the pool only moments ago.

    The probe (an empty query) finds connections a server restart or a cut network
    broke while they sat idle. Probing every checkout cost one round trip per
    statement; a connection returned within ``CHECK_AFTER_IDLE_S`` was answering then,
    and if it broke since, its statement fails as an infrastructure error, which every
    caller already retries, and the pool discards it on return.
    """
    returned = _returned_at.get(conn)
    if returned is None or time.monotonic() - returned > CHECK_AFTER_IDLE_S:
        await AsyncConnectionPool.check_connection(conn)


def default_source_id() -> str:
    """A producer's journal address space: unique per process start."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
