"""The store's pool takes a connection back in the task that used it, and still knows
which connections sat idle long enough to be probed before reuse.

A pool with a ``reset`` callback hands every returned connection to one of its worker
tasks (psycopg_pool's ``ReturnConnection``): a queue hop and a task switch per statement,
and the connection unavailable to the next checkout until that task ran. The stamp the
idle check reads is taken by ``Database`` itself instead, as the sync face's is
(docs/explanation/admission-path.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import runfleet.store.db as db_module
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.store.helpers import create


@pytest.fixture
async def one_connection(settings: Settings) -> AsyncIterator[Store]:
    opened = await Store.open(settings.model_copy(update={"pool_min": 1, "pool_max": 1}))
    try:
        await create(opened, "pooled")  # connected and prepared
        yield opened
    finally:
        await opened.close()


async def _uses(store: Store) -> None:
    """A transaction, then three statements, each its own checkout (each checkout reads
    the stamp the one before it left, the transaction's included)."""
    async with store.db.transaction():
        assert await store.runs.get("pooled") is not None
    for _ in range(3):
        assert await store.runs.get("pooled") is not None


async def test_a_statement_returns_its_connection_without_a_pool_task(
    one_connection: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = one_connection.db.pool
    tasks: list[str] = []
    real = pool.run_task

    def run_task(task: Any) -> None:
        tasks.append(type(task).__name__)
        real(task)

    monkeypatch.setattr(pool, "run_task", run_task)
    real_future = asyncio.ensure_future

    def ensure_future(aw: Any, **kwargs: Any) -> Any:
        tasks.append(getattr(aw, "__qualname__", type(aw).__name__))
        return real_future(aw, **kwargs)

    # An idle connection goes back inline: no task of its own either (the shielded
    # return is for a connection handed back mid-transaction).
    monkeypatch.setattr(asyncio, "ensure_future", ensure_future)
    await _uses(one_connection)
    assert tasks == [], "a returned connection went through a task"


@pytest.mark.parametrize(("idle_after_s", "probes"), [(3600.0, 0), (-1.0, 4)])
async def test_only_a_connection_idle_past_the_threshold_is_probed(
    one_connection: Store, monkeypatch: pytest.MonkeyPatch, idle_after_s: float, probes: int
) -> None:
    """Back to back, every checkout finds the stamp its last use left: no probe. With a
    threshold already passed, every checkout probes once."""
    sent: list[object] = []
    real = AsyncConnectionPool.check_connection

    async def check_connection(conn: Any) -> None:
        sent.append(conn)
        await real(conn)

    monkeypatch.setattr(db_module, "CHECK_AFTER_IDLE_S", idle_after_s)
    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(check_connection))
    await _uses(one_connection)
    assert len(sent) == probes


async def test_a_cancelled_return_keeps_its_rollback_and_its_connection(
    one_connection: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection handed back mid-transaction waits for the pool's rollback, in the
    task that returns it. Cancelling that task must neither cut the rollback short (the
    pool would close the connection and open another, and swallow the cancel) nor leave
    the return unowned: the task ends cancelled, the store holds the return until it is
    done, and the same connection serves the next statement."""
    pool = one_connection.db.pool
    real_rollback = psycopg.AsyncConnection.rollback
    rolling_back, release = asyncio.Event(), asyncio.Event()

    async def slow_rollback(conn: psycopg.AsyncConnection[Any]) -> None:
        rolling_back.set()
        await release.wait()
        await real_rollback(conn)

    monkeypatch.setattr(psycopg.AsyncConnection, "rollback", slow_rollback)
    used: list[object] = []

    async def left_in_a_transaction() -> None:
        async with one_connection.db._statement() as conn:
            used.append(conn)
            await conn.execute("BEGIN")

    task = asyncio.create_task(left_in_a_transaction())
    await asyncio.wait_for(rolling_back.wait(), 10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled(), "the cancel was swallowed by the return"
    # Nobody awaits the return any more: the store holds it (the loop's reference to a
    # task is weak), and lets go once it is done.
    assert len(db_module._returning) == 1
    release.set()
    assert await asyncio.wait_for(one_connection.runs.get("pooled"), 10) is not None
    async with one_connection.db._statement() as conn:
        assert conn is used[0], "the connection was closed and replaced"
    stats = pool.get_stats()
    assert stats["pool_size"] == 1 and stats.get("returns_bad", 0) == 0, stats
    assert not db_module._returning
