"""The sync ``Queue``'s one-statement calls run in the caller's thread (``store.inline``).

Counted on the wire of the blocking pool's one connection: an ``enqueue`` is one
statement and one round trip, ``wait()`` and ``return_value()`` of a settled run one
read each, and the queue's event-loop thread never connects for any of them (no thread
hop). A transient error is retried in the caller's thread, with no loop to sleep on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from runfleet.producer.run import RunFailed
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.inline import Suspended, drive
from runfleet.store.journal import Kind
from runfleet.store.types import RunStatus, Transitioned
from tests.broker.test_producer_round_trips import Wire
from tests.store.helpers import OWNER_A, activate
from tests.support.polling import until


def noop(n: int) -> int:
    return n


@contextmanager
def traced(settings: Settings) -> Iterator[tuple[Queue, Wire]]:
    one = settings.model_copy(update={"pool_min": 1, "pool_max": 1})
    wire = Wire()
    with Queue("default", settings=one) as queue:
        pool = queue._inline.queue().store.db.blocking_pool  # type: ignore[attr-defined]  # the inline store's database is store.inline's, which has the pool
        with pool.connection() as conn:
            wire.attach(conn)
        try:
            yield queue, wire
        finally:
            with pool.connection() as conn:
                conn.pgconn.untrace()
            wire.close()


async def _settle(store: Store, run_id: str, status: RunStatus, error: object = None) -> None:
    row = await activate(store, run_id)
    patch = {"result": 7} if status is RunStatus.COMPLETED else {"error": error}
    done = await store.lifecycle.transition_owned(
        run_id, OWNER_A, row.epoch, status, state_patch=patch
    )
    assert isinstance(done, Transitioned), done


async def test_a_sync_enqueue_is_one_statement_in_the_callers_thread(
    settings: Settings, store: Store
) -> None:
    def admit() -> tuple[list[str], int, int, bool]:
        with traced(settings) as (queue, wire):
            queue.enqueue(noop, 0)  # the connection's first use may prepare
            wire.reset()
            job = queue.enqueue(noop, 1, job_id="sync-1")
            return [job.id], wire.statements, wire.round_trips, queue._driver.connected

    ids, statements, round_trips, loop_connected = await asyncio.to_thread(admit)
    assert (statements, round_trips) == (1, 1)
    assert not loop_connected, "the loop thread's queue was never needed"
    assert ids == ["sync-1"]
    row = await store.runs.get("sync-1")
    assert row is not None and row.status is RunStatus.PENDING
    assert row.payload == {"args": [1], "kwargs": {}}
    assert [r.kind for r in await store.journal.records("sync-1")] == [Kind.CREATED]


async def test_wait_and_return_value_of_a_settled_run_are_one_read_each(
    settings: Settings, store: Store
) -> None:
    with Queue("default", settings=settings) as producer:
        await asyncio.to_thread(producer.enqueue, noop, 3, job_id="done")
        await asyncio.to_thread(producer.enqueue, noop, 4, job_id="broken")
    await _settle(store, "done", RunStatus.COMPLETED)
    await _settle(store, "broken", RunStatus.FAILED, error={"type": "E", "message": "no"})

    def read() -> tuple[object, int, object, int, bool, bool]:
        with traced(settings) as (queue, wire):
            job = queue.fetch("done")
            job.return_value(refresh=True)  # prepare on first use
            wire.reset()
            result = job.wait(timeout=5)
            result_reads = wire.statements
            wire.reset()
            value = job.return_value(refresh=True)
            value_reads = wire.statements
            with pytest.raises(RunFailed):
                queue.fetch("broken").wait(timeout=5)
            broken = queue.fetch("broken").return_value(refresh=True) is None
            return result, result_reads, value, value_reads, broken, queue._driver.connected

    result, result_reads, value, value_reads, broken, loop_connected = await asyncio.to_thread(read)
    assert (result, value) == (7, 7)
    assert (result_reads, value_reads) == (1, 1)
    assert broken
    assert not loop_connected


async def test_an_open_run_still_waits_on_the_loop_thread(settings: Settings, store: Store) -> None:
    """wait() of a run not yet settled subscribes and waits: that is the loop's work."""
    with Queue("default", settings=settings) as queue:
        job = await asyncio.to_thread(queue.enqueue, noop, 5, job_id="later")
        waiting = asyncio.create_task(asyncio.to_thread(job.wait, 30))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await _settle(store, "later", RunStatus.COMPLETED)
        assert await asyncio.wait_for(waiting, 30) == 7
        assert queue._driver.connected


async def test_a_transient_error_is_retried_in_the_callers_thread(
    settings: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue("default", settings=settings) as queue:
        runs = queue._inline.queue().store.admission
        real = runs.admit_each
        calls: list[int] = []

        async def flaky(news):  # type: ignore[no-untyped-def]  # stands in for admit_each; its types are that method's
            calls.append(len(news))
            if len(calls) == 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return await real(news)

        monkeypatch.setattr(runs, "admit_each", flaky)
        job = await asyncio.to_thread(queue.enqueue, noop, 9, job_id="retried")
        assert job.id == "retried" and calls == [1, 1]
        assert not queue._driver.connected
    row = await store.runs.get("retried")
    assert row is not None and row.payload == {"args": [9], "kwargs": {}}


def test_drive_refuses_a_coroutine_that_suspends() -> None:
    async def waits() -> None:
        await asyncio.sleep(0)

    async def returns() -> int:
        return 4

    assert drive(returns()) == 4
    with pytest.raises(Suspended):
        drive(waits())


def test_a_closed_queue_does_not_reopen_its_blocking_pool(settings: Settings) -> None:
    queue = Queue("default", settings=settings)
    queue.enqueue(noop, 1)
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.enqueue(noop, 2)
    assert queue._inline._queue is None


def _probes(wire: Wire) -> int:
    """The pool's health probes (an empty simple Query) the traced connection sent."""
    return sum(1 for m in wire._sent() if m[2] == "Query" and m[3].strip() == '""')


async def test_a_sync_enqueue_returns_its_connection_in_the_callers_thread(
    settings: Settings,
) -> None:
    """No pool worker takes part in a sync enqueue: a pool with a ``reset`` callback hands
    every returned connection to its worker thread, and the next checkout waited for it
    (a thread hop per statement, docs/explanation/admission-path.md)."""

    def admit() -> list[str]:
        with traced(settings) as (queue, _wire):
            pool = queue._inline.queue().store.db.blocking_pool  # type: ignore[attr-defined]  # store.inline's database
            queue.enqueue(noop, 0)  # connected, prepared
            tasks: list[str] = []
            real = pool.run_task

            def run_task(task: object) -> None:
                tasks.append(type(task).__name__)
                real(task)  # the pool's own task, passed on

            pool.run_task = run_task  # counts the pool's worker tasks
            for n in range(1, 4):
                queue.enqueue(noop, n)
            queue.fetch(queue.enqueue(noop, 4).id).get_status(refresh=True)
            return list(tasks)  # before the pool's close queues its StopWorker tasks

    assert await asyncio.to_thread(admit) == []


async def test_the_inline_pool_probes_an_idle_connection_only(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The return stamp ``_check_if_idle`` reads is still taken: back-to-back calls send
    no probe, and a connection idle past ``CHECK_AFTER_IDLE_S`` is probed once."""
    import runfleet.store.inline as inline_module

    def admit(idle_after_s: float) -> int:
        monkeypatch.setattr(inline_module, "CHECK_AFTER_IDLE_S", idle_after_s)
        with traced(settings) as (queue, wire):
            queue.enqueue(noop, 0)
            wire.reset()
            for n in range(1, 4):
                queue.enqueue(noop, n)
            return _probes(wire)

    assert await asyncio.to_thread(admit, 3600.0) == 0  # returned moments ago: trusted
    assert await asyncio.to_thread(admit, -1.0) == 3  # "idle" at once: one probe a checkout


def _watching(queue: Queue, run_id: str) -> bool:
    hub = queue._async.notifier._hubs.get(queue._driver.loop)
    return hub is not None and run_id in hub._watches


def _checked(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def checked() -> bool:
        return check()

    return checked


async def _trace_loop_pool(queue: Queue, wire: Wire, on: bool) -> None:
    async with queue._async.store.db.pool.connection() as conn:
        if on:
            wire.attach(conn)
        else:
            conn.pgconn.untrace()


async def test_a_wait_joining_the_loops_live_subscription_reads_once_on_the_loop_thread(
    settings: Settings, store: Store
) -> None:
    """While another wait holds the loop's settled subscription, ``wait()`` of an open run
    reads nothing in the caller's thread: the loop thread's one read after entering the
    subscription answers for it, then the notice (or the poll) and one more read."""
    with Queue("default", settings=settings) as producer:
        for name in ("holder", "joiner"):
            await asyncio.to_thread(producer.enqueue, noop, 1, job_id=name)
    with traced(settings) as (queue, caller_wire):
        holder_job, joiner_job = [
            await asyncio.to_thread(queue.fetch, n) for n in ("holder", "joiner")
        ]
        holder = asyncio.create_task(asyncio.to_thread(holder_job.wait, 30))
        await until(_checked(queue._settled_shared), 10, "the shared subscription")
        loop_wire = Wire()
        await asyncio.to_thread(queue._call, _trace_loop_pool(queue, loop_wire, True))
        caller_wire.reset()
        joiner = asyncio.create_task(asyncio.to_thread(joiner_job.wait, 30))
        await until(_checked(lambda: _watching(queue, "joiner")), 10, "the joiner to watch")
        await asyncio.sleep(0.05)  # it has read its run and waits for the notice
        assert (caller_wire.statements, loop_wire.statements) == (0, 1), loop_wire.queries()
        for name in ("holder", "joiner"):
            await _settle(store, name, RunStatus.COMPLETED)
        assert await asyncio.wait_for(joiner, 30) == 7
        assert await asyncio.wait_for(holder, 30) == 7
        await asyncio.to_thread(queue._call, _trace_loop_pool(queue, loop_wire, False))
        loop_wire.close()


async def test_a_job_enqueued_under_the_live_subscription_waits_with_no_read_before_its_notice(
    settings: Settings, store: Store
) -> None:
    """A job whose admission came while the loop's settled subscription was up carries the
    subscription's mark (taken in the caller's thread before the commit): its ``wait()``
    reads nothing before the run's notice, then once on the loop thread. A job fetched by
    id carries none."""
    with traced(settings) as (queue, caller_wire):
        holder_job = await asyncio.to_thread(queue.enqueue, noop, 1, job_id="holder")
        assert holder_job._settled_mark is None, "nothing was listening yet"
        holder = asyncio.create_task(asyncio.to_thread(holder_job.wait, 30))
        await until(_checked(queue._settled_shared), 10, "the shared subscription")
        job = await asyncio.to_thread(queue.enqueue, noop, 2, job_id="marked")
        assert job._settled_mark is not None
        assert (await asyncio.to_thread(queue.fetch, "marked"))._settled_mark is None
        loop_wire = Wire()
        await asyncio.to_thread(queue._call, _trace_loop_pool(queue, loop_wire, True))
        caller_wire.reset()
        waiting = asyncio.create_task(asyncio.to_thread(job.wait, 30))
        await until(_checked(lambda: _watching(queue, "marked")), 10, "the wait to watch")
        await asyncio.sleep(0.05)
        assert (caller_wire.statements, loop_wire.statements) == (0, 0), loop_wire.queries()
        await _settle(store, "marked", RunStatus.COMPLETED)
        await queue._async.notifier.publish_settled("marked", RunStatus.COMPLETED)
        assert await asyncio.wait_for(waiting, 30) == 7
        assert (caller_wire.statements, loop_wire.statements) == (0, 1), loop_wire.queries()
        await _settle(store, "holder", RunStatus.COMPLETED)
        assert await asyncio.wait_for(holder, 30) == 7
        await asyncio.to_thread(queue._call, _trace_loop_pool(queue, loop_wire, False))
        loop_wire.close()


async def test_a_wait_joining_the_live_subscription_follows_a_requeued_round(
    settings: Settings, store: Store
) -> None:
    """rq keeps one id across a requeue: a ``wait()`` that reads on the loop thread answers
    with the round that replaced a failed run, as the caller-thread read does."""
    with Queue("default", settings=settings) as queue:
        for name in ("holder", "failing"):
            await asyncio.to_thread(queue.enqueue, noop, 1, job_id=name)
        await _settle(store, "failing", RunStatus.FAILED, error={"type": "E", "message": "no"})
        again = await asyncio.to_thread(queue._call, queue._async.requeue("failing"))
        holder_job, failing_job = [
            await asyncio.to_thread(queue.fetch, n) for n in ("holder", "failing")
        ]
        holder = asyncio.create_task(asyncio.to_thread(holder_job.wait, 30))
        await until(_checked(queue._settled_shared), 10, "the shared subscription")
        waiting = asyncio.create_task(asyncio.to_thread(failing_job.wait, 30))
        await until(_checked(lambda: _watching(queue, again.id)), 10, "the wait to follow")
        assert not waiting.done()
        for name in ("holder", again.id):
            await _settle(store, name, RunStatus.COMPLETED)
        assert await asyncio.wait_for(waiting, 30) == 7
        assert await asyncio.wait_for(holder, 30) == 7
