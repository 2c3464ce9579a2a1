"""Shared set-up for the store contract tests: owners, runs in a given state, db time, gates.

Everything here goes through the public ``Store`` API except the few read-only probes a
test needs to prove "nothing was written" (row counts) and the lock gate that makes
contenders queue on the same row at the same instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg import sql

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    Activated,
    Created,
    JsonValue,
    NewRun,
    OnParentExit,
    Owner,
    Parked,
    RunRow,
    RunStatus,
    Waiting,
)
from tests.support.polling import until

OWNER_A = Owner("host-a", 101, "nonce-a")
OWNER_B = Owner("host-b", 202, "nonce-b")
OWNER_C = Owner("host-c", 303, "nonce-c")
NOBODY = Owner("host-z", 999, "nonce-z")
"""Owns nothing: used where an operation needs an owner but must match no row."""

DEADLINE_S = 10.0
T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")


async def create(
    store: Store,
    run_id: str,
    *,
    flow: str = "tests.flow",
    payload: JsonValue = None,
    parent_id: str | None = None,
    on_parent_exit: OnParentExit = OnParentExit.CANCEL,
    scopes: tuple[str, ...] = (),
    **extra: Any,
) -> RunRow:
    """Admit a new run and insist it was created (not joined)."""
    outcome = await store.admission.create(
        NewRun(
            id=run_id,
            flow=flow,
            payload=payload,
            parent_id=parent_id,
            on_parent_exit=on_parent_exit,
            scopes=scopes,
            **extra,
        )
    )
    assert isinstance(outcome, Created), outcome
    return outcome.row


async def activate(store: Store, run_id: str, owner: Owner = OWNER_A) -> RunRow:
    """Claim-and-activate a runnable row from a fresh read; insist it worked."""
    current = await store.runs.get(run_id)
    assert current is not None
    outcome = await store.runs.claim_and_activate(run_id, current.snapshot, owner)
    assert isinstance(outcome, Activated), outcome
    return outcome.row


async def make_running(
    store: Store, run_id: str, owner: Owner = OWNER_A, **create_kwargs: Any
) -> RunRow:
    """A new run, running under ``owner`` at epoch 1."""
    await create(store, run_id, **create_kwargs)
    row = await activate(store, run_id, owner)
    assert row.status is RunStatus.RUNNING and row.owner == owner and row.epoch == 1
    return row


async def make_parked(
    store: Store,
    run_id: str,
    waiting: Waiting,
    owner: Owner = OWNER_A,
    *,
    deferred: str | None = None,
    **create_kwargs: Any,
) -> RunRow:
    """A new run that ran once and parked on ``waiting`` (suspended, wait pending)."""
    running = await make_running(store, run_id, owner, **create_kwargs)
    outcome = await store.waits.park(run_id, owner, running.epoch, waiting, deferred=deferred)
    assert isinstance(outcome, Parked), outcome
    row = await store.runs.get(run_id)
    assert row is not None and row.status is RunStatus.SUSPENDED
    return row


async def must_get(store: Store, run_id: str) -> RunRow:
    row = await store.runs.get(run_id)
    assert row is not None, f"run {run_id} missing"
    return row


async def db_now(store: Store) -> int:
    """Database time in ms (a heartbeat for no runs renews nothing and reports the clock)."""
    return (await store.runs.heartbeat(NOBODY, [])).now_ms


async def wait_db_time_past(store: Store, ms: int) -> int:
    """Wait until the database clock reads strictly more than ``ms``; return that time."""
    return await until(
        lambda: db_now(store),
        DEADLINE_S,
        f"db time > {ms}",
        accept=lambda now: now > ms,
        every=0.002,
    )


async def journal_kinds(store: Store, run_id: str) -> list[str]:
    return [r.kind for r in await store.journal.records(run_id)]


async def count(database_url: str, table: str) -> int:
    """Rows in ``runfleet.<table>`` (read-only probe for "nothing was written")."""
    query = sql.SQL("SELECT count(*) FROM runfleet.{}").format(sql.Identifier(table))
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(query)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


COUNTED = ("runs", "journal", "run_parents", "deferreds", "clocks", "steps", "attempts")


async def counts(database_url: str) -> dict[str, int]:
    """Row counts of every durable table, read in one snapshot."""
    query = sql.SQL("SELECT {}").format(
        sql.SQL(", ").join(
            sql.SQL("(SELECT count(*) FROM runfleet.{})").format(sql.Identifier(t)) for t in COUNTED
        )
    )
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(query)
        row = await cur.fetchone()
    assert row is not None
    return dict(zip(COUNTED, (int(n) for n in row), strict=True))


@asynccontextmanager
async def extra_stores(settings: Settings, n: int) -> AsyncIterator[list[Store]]:
    """``n`` independent stores (own pool, own connections, own journal source id)."""
    stores: list[Store] = []
    try:
        for _ in range(n):
            stores.append(await Store.open(settings, min_size=1, max_size=2))
        yield stores
    finally:
        for opened in stores:
            await opened.close()


async def lock_waiters(database_url: str) -> int:
    """Sessions of this test's database currently blocked on a lock."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return await LockGate(conn).waiters()


class LockGate:
    """Holds a lock so that contenders pile up behind it, then lets them all go at once.

    A race is only tested if the contenders are really in flight together: the gate
    waits until the database reports ``n`` sessions blocked on a lock before releasing.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def waiters(self) -> int:
        cur = await self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND pid <> pg_backend_pid()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


@asynccontextmanager
async def row_lock_gate(database_url: str, run_id: str) -> AsyncIterator[LockGate]:
    """Lock ``run_id``'s row until the block ends (the gate's transaction commits)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM runfleet.runs WHERE id = %s FOR UPDATE", (run_id,))
            async with await psycopg.AsyncConnection.connect(
                database_url, autocommit=True
            ) as observer:
                yield LockGate(observer)


async def race(
    contenders: Sequence[Callable[[], Awaitable[T]]],
    *,
    gate: AbstractAsyncContextManager[LockGate] | None = None,
) -> list[T]:
    """Start every contender at the same instant; with ``gate``, also make them queue.

    Without a gate the contenders wait on one event and go together. With a gate they
    go while it holds its lock, and the gate opens only once all are blocked behind it.
    """
    start = asyncio.Event()

    async def run(contender: Callable[[], Awaitable[T]]) -> T:
        await start.wait()
        return await contender()

    if gate is None:
        tasks = [asyncio.ensure_future(run(c)) for c in contenders]
        start.set()
        return list(await asyncio.gather(*tasks))
    async with gate as lock:
        tasks = [asyncio.ensure_future(run(c)) for c in contenders]
        start.set()
        await until(
            lock.waiters,
            DEADLINE_S,
            f"{len(contenders)} lock waiters",
            accept=lambda n: n >= len(contenders),
            every=0.002,
        )
    return list(await asyncio.gather(*tasks))


async def race_pair(
    first: Callable[[], Awaitable[A]],
    second: Callable[[], Awaitable[B]],
    *,
    second_starts_first: bool = False,
    gate: AbstractAsyncContextManager[LockGate] | None = None,
) -> tuple[A, B]:
    """``race`` for two different operations; answers in (first, second) order.

    ``second_starts_first`` swaps the launch (and so the lock-queue) order, so that a
    loop alternating it exercises both interleavings.
    """

    async def one() -> object:
        return await first()

    async def two() -> object:
        return await second()

    if second_starts_first:
        got_two, got_one = await race([two, one], gate=gate)
    else:
        got_one, got_two = await race([one, two], gate=gate)
    return cast(A, got_one), cast(B, got_two)


async def committed_rows_counted(url: str, table: str, rows: int) -> None:
    """Until the statistics collector counts at least ``rows`` live rows in ``table``
    (``runfleet.analyze_grown`` goes by that count): a connection reports its inserts
    when it next idles or exits, which may land after the caller's next statement."""

    async def counted() -> bool:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT pg_stat_get_live_tuples(%(t)s::regclass)", {"t": table}
            )
            row = await cur.fetchone()
        return row is not None and int(row[0]) >= rows

    await until(counted, DEADLINE_S, f"{rows} live rows of {table} counted")


ANALYZED_AS_JSON = (
    "auto_explain.log_analyze = on",
    "auto_explain.log_buffers = on",
    "auto_explain.log_format = json",
)
"""``explain_every_statement``'s settings for executed plans (rows, buffers) in JSON."""


async def explain_every_statement(
    conn: psycopg.AsyncConnection[Any], notices: list[str], *settings: str, local: bool = False
) -> None:
    """auto_explain on ``conn``: the plan of every statement it runs, nested ones (a
    function's) included, with a function scan's arguments, appended to ``notices``.
    ``local``: the settings last until the open transaction ends (``SET LOCAL``)."""
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    await conn.execute("LOAD 'auto_explain'")
    scope = "SET LOCAL" if local else "SET"
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_level = notice",
        "auto_explain.log_verbose = on",  # a function scan's arguments
        *settings,
    ):
        await conn.execute(f"{scope} {setting}")
