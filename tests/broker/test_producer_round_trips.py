"""What a producer costs Postgres, counted on the wire (libpq's protocol trace).

One ``enqueue`` is one statement (``runfleet.admit``: the run row and its ``created``
record): one round trip, no BEGIN/COMMIT. Concurrent enqueues on one ``AsyncQueue``
share a round trip (group commit), each caller still getting its own run or its own
error. ``result()`` on a settled run is one read and no subscription; a wait that joins a
live shared subscription reads once before its notice. The sync ``Queue``
makes the same statements from the caller's own thread: its loop thread never connects.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg import pq

from runfleet.broker.notify import SettledWatch
from runfleet.producer import AsyncQueue
from runfleet.producer.run import AsyncRun
from runfleet.store.config import Settings
from runfleet.store.errors import ExecutionIdentityConflict, InvalidInput
from runfleet.store.journal import Kind
from runfleet.store.types import CreateOutcome, NewRun, RunStatus, Transitioned
from tests.store.helpers import OWNER_A, activate
from tests.support.polling import until


def noop(n: int) -> int:
    return n


class Wire:
    """Frontend messages one connection sent, from libpq's trace of it."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(mode="w+")  # closed in close()
        self._mark = 0

    def attach(self, conn: psycopg.AsyncConnection[Any]) -> None:
        conn.pgconn.trace(self._file.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def _sent(self) -> list[list[str]]:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.seek(0)
        lines = self._file.read().splitlines()[self._mark :]
        return [line.split("\t") for line in lines if line.startswith("F\t")]

    def reset(self) -> None:
        self._file.seek(0)
        self._mark = len(self._file.read().splitlines())

    def queries(self) -> list[str]:
        """Simple-protocol statements sent (the pool's empty health probe not counted)."""
        return [m[3].strip() for m in self._sent() if m[2] == "Query" and m[3].strip() != '""']

    @property
    def statements(self) -> int:
        """Statements executed: extended-protocol Executes plus simple Queries."""
        return sum(1 for m in self._sent() if m[2] == "Execute") + len(self.queries())

    @property
    def round_trips(self) -> int:
        """Each Sync (end of a pipeline or of one extended statement) or simple Query."""
        return sum(1 for m in self._sent() if m[2] == "Sync") + len(self.queries())

    def close(self) -> None:
        self._file.close()


@asynccontextmanager
async def traced(settings: Settings) -> AsyncIterator[tuple[AsyncQueue, Wire]]:
    """A queue whose store has exactly one connection, traced."""
    one = settings.model_copy(update={"pool_min": 1, "pool_max": 1})
    wire = Wire()
    async with AsyncQueue("default", settings=one) as queue:
        async with queue.store.db.pool.connection() as conn:
            wire.attach(conn)
        try:
            yield queue, wire
        finally:
            async with queue.store.db.pool.connection() as conn:
                conn.pgconn.untrace()
            wire.close()


async def test_one_enqueue_is_one_round_trip(settings: Settings) -> None:
    async with traced(settings) as (queue, wire):
        await queue.enqueue(noop, 0)  # the first use of the connection may prepare
        wire.reset()
        run = await queue.enqueue(noop, 1)
        assert (wire.statements, wire.round_trips) == (1, 1), wire.queries()
        assert "BEGIN" not in wire.queries() and "COMMIT" not in wire.queries()
        records = await queue.store.journal.records(run.id)
        assert [r.kind for r in records] == [Kind.CREATED]
        assert (await run.fetch()).status is RunStatus.PENDING


async def test_result_of_a_settled_run_is_one_read(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with traced(settings) as (queue, wire):
        run = await queue.enqueue(noop, 3)
        row = await activate(queue.store, run.id)
        settled = await queue.store.lifecycle.transition_owned(
            run.id, OWNER_A, row.epoch, RunStatus.COMPLETED
        )
        assert isinstance(settled, Transitioned), settled
        opened: list[tuple[str, ...]] = []
        watch = queue.notifier.watch_settled

        def watching(*ids: str) -> SettledWatch:
            opened.append(ids)
            return watch(*ids)

        monkeypatch.setattr(queue.notifier, "watch_settled", watching)
        wire.reset()
        assert await run.result(timeout=5) is None
        assert (wire.statements, wire.round_trips) == (1, 1)
        assert opened == [], "a settled run needs no settled-notification subscription"


async def test_concurrent_enqueues_share_round_trips_and_keep_their_own_outcomes(
    settings: Settings,
) -> None:
    async with traced(settings) as (queue, wire):
        taken = await queue.enqueue(noop, 1, job_id="taken")
        wire.reset()
        special = {
            10: lambda: queue.enqueue(noop, 2, job_id="taken"),  # same id, other arguments
            20: lambda: queue.enqueue(noop, 1, job_id="taken"),  # same id and identity: joins
            30: lambda: queue.enqueue(noop, 1, 2),  # does not match noop(n): refused alone
            40: lambda: queue.enqueue(noop, 40, job_id="run-41"),  # collides inside the batch
        }
        calls = [
            special[i]() if i in special else queue.enqueue(noop, i, job_id=f"run-{i}")
            for i in range(100)
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        # Every call reaches the queue in one turn of the loop: one batch, one statement.
        assert (wire.statements, wire.round_trips) == (1, 1), wire.queries()
        for i, outcome in enumerate(outcomes):
            if i == 10:
                assert isinstance(outcome, ExecutionIdentityConflict)
                assert outcome.field == "payload"
            elif i == 20:
                assert isinstance(outcome, AsyncRun) and outcome.id == taken.id
            elif i == 30:
                assert isinstance(outcome, InvalidInput)
            elif i == 40:  # first in the batch: run-41 is admitted as noop(40)
                assert isinstance(outcome, AsyncRun) and outcome.id == "run-41"
            elif i == 41:  # then noop(41) under the same id is another identity
                assert isinstance(outcome, ExecutionIdentityConflict)
            else:
                assert isinstance(outcome, AsyncRun) and outcome.id == f"run-{i}", outcome
        admitted = [o for o in outcomes if isinstance(o, AsyncRun) and o.id != "taken"]
        assert len(admitted) == 96
        for run in admitted:
            row = await run.fetch()
            n = 40 if run.id == "run-41" else int(run.id.removeprefix("run-"))
            assert row.payload == {"args": [n], "kwargs": {}}
            assert [r.kind for r in await queue.store.journal.records(run.id)] == [Kind.CREATED]
        assert [r.kind for r in await queue.store.journal.records("taken")] == [Kind.CREATED]
        assert (await taken.fetch()).payload == {"args": [1], "kwargs": {}}


async def test_a_batch_refused_as_a_whole_is_admitted_run_by_run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncQueue("default", settings=settings) as queue:
        runs = queue.store.admission
        real = runs.admit_each
        sizes: list[int] = []

        async def refusing(news: Sequence[NewRun]) -> list[CreateOutcome | Exception]:
            sizes.append(len(news))
            if any(new.id == "poison" for new in news):
                raise psycopg.errors.DataException("refused for the whole batch")
            return await real(news)

        monkeypatch.setattr(runs, "admit_each", refusing)
        ids = ["a", "poison", "b", "c"]
        outcomes = await asyncio.gather(
            *(queue.enqueue(noop, 1, job_id=i) for i in ids), return_exceptions=True
        )
        assert sizes[0] == 4 and sizes[1:] == [1, 1, 1, 1], sizes
        assert isinstance(outcomes[1], psycopg.errors.DataException)
        assert [o.id for o in outcomes if isinstance(o, AsyncRun)] == ["a", "b", "c"]
        assert await queue.store.runs.get("poison") is None


async def test_sequential_enqueues_are_not_held_back(settings: Settings) -> None:
    """A lone caller waits for no window: ten enqueues in a row take ten round trips."""
    async with traced(settings) as (queue, wire):
        for i in range((settings.prepare_threshold or 0) + 1):  # past the one-off prepare
            await queue.enqueue(noop, -i)
        wire.reset()
        for i in range(10):
            await queue.enqueue(noop, i)
        assert wire.round_trips == 10


async def test_a_wait_that_joins_a_live_subscription_reads_once_before_its_notice(
    settings: Settings,
) -> None:
    """With the settled subscription already shared (another wait holds it), entering it
    costs no round trip, so a wait reads its run once after entering, not once before and
    again after; an open run's wait then needs its notice (or the poll) and one more read."""
    async with traced(settings) as (queue, wire):
        first, second = await queue.enqueue(noop, 1), await queue.enqueue(noop, 2)
        holder = asyncio.create_task(first.wait(timeout=30))
        await until(_async(queue.notifier.settled_shared), 10, "the shared subscription")
        wire.reset()
        waiter = asyncio.create_task(second.wait(timeout=30))
        await until(_async(lambda: _watched(queue, second.id)), 10, "the second wait to watch")
        await asyncio.sleep(0.05)  # it has read its run and waits for the notice
        assert wire.statements == 1, wire.queries()

        for run in (first, second):
            row = await activate(queue.store, run.id)
            done = await queue.store.lifecycle.transition_owned(
                run.id, OWNER_A, row.epoch, RunStatus.COMPLETED
            )
            assert isinstance(done, Transitioned), done
        assert await waiter is None and await holder is None  # woken by the poll


async def _settle(queue: AsyncQueue, run: AsyncRun, *, notice: bool) -> None:
    row = await activate(queue.store, run.id)
    done = await queue.store.lifecycle.transition_owned(
        run.id, OWNER_A, row.epoch, RunStatus.COMPLETED
    )
    assert isinstance(done, Transitioned), done
    if notice:  # as a worker announces its settlement, after the commit
        await queue.notifier.publish_settled(run.id, RunStatus.COMPLETED)


async def test_a_wait_of_a_run_admitted_under_a_live_subscription_reads_only_after_its_notice(
    settings: Settings,
) -> None:
    """A run admitted while the settled subscription was shared and up (another wait holds
    it) cannot settle unseen: its wait enters the subscription and waits for the notice
    before its one read, where a run admitted before reads once after entering and once
    after its notice. A notice that came before the wait is remembered; a run the
    admission joined (its id taken) settled before anything was marked: it reads first."""
    async with traced(settings) as (queue, wire):
        first = await queue.enqueue(noop, 1)
        holder = asyncio.create_task(first.wait(timeout=30))
        await until(_async(queue.notifier.settled_shared), 10, "the shared subscription")
        second, third = await queue.enqueue(noop, 2), await queue.enqueue(noop, 3)
        assert second.created and second._settled_mark is not None

        wire.reset()
        waiter = asyncio.create_task(second.wait(timeout=30))
        await until(_async(lambda: _watched(queue, second.id)), 10, "the second wait to watch")
        await asyncio.sleep(0.05)
        assert wire.statements == 0, wire.queries()  # waiting for its notice, not reading
        await _settle(queue, second, notice=True)
        wire.reset()
        assert await waiter is None
        assert wire.statements == 1, wire.queries()  # the one read, after the notice

        await _settle(queue, third, notice=True)  # its notice comes before its wait
        await until(_async(lambda: queue.notifier._settled_hub().received >= 2), 10, "notices")
        wire.reset()
        started = time.monotonic()
        assert await third.wait(timeout=30) is None
        assert time.monotonic() - started < 0.4, "answered by the remembered notice, not a poll"
        assert wire.statements == 1, wire.queries()

        joined = await queue.enqueue(noop, 2, run_id=second.id)  # the same call: joined
        assert not joined.created and joined._settled_mark is None
        wire.reset()
        started = time.monotonic()
        assert await joined.wait(timeout=30) is None
        assert time.monotonic() - started < 0.4, "a joined run's wait reads at once"
        assert wire.statements == 1, wire.queries()

        await _settle(queue, first, notice=True)
        assert await holder is None


def _watched(queue: AsyncQueue, run_id: str) -> bool:
    hub = queue.notifier._hubs.get(asyncio.get_running_loop())
    return hub is not None and run_id in hub._watches


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def checked() -> bool:
        return check()

    return checked


async def test_the_waits_of_one_settled_batch_read_their_runs_in_one_statement(
    settings: Settings,
) -> None:
    """Twenty waits under a live shared subscription, whose runs settle together with their
    notices sent together (as a worker's group-committed settlement announces them):
    their reads after the notices share ``runs.get_many`` statements, each wait getting
    its own run's result."""
    async with traced(settings) as (queue, wire):
        first = await queue.enqueue(noop, 0)
        holder = asyncio.create_task(first.wait(timeout=30))
        await until(_async(queue.notifier.settled_shared), 10, "the shared subscription")
        runs = [await queue.enqueue(noop, i) for i in range(1, 21)]
        waits = [asyncio.create_task(run.wait(timeout=30)) for run in runs]
        ids = [run.id for run in runs]
        await until(_async(lambda: all(_watched(queue, i) for i in ids)), 10, "every wait")
        for run in runs:
            row = await activate(queue.store, run.id)
            done = await queue.store.lifecycle.transition_owned(
                run.id,
                OWNER_A,
                row.epoch,
                RunStatus.COMPLETED,
                state_patch={"result": int(run.id, 16) % 97},
            )
            assert isinstance(done, Transitioned), done
        wire.reset()
        await asyncio.gather(
            *(queue.notifier.publish_settled(run.id, RunStatus.COMPLETED) for run in runs)
        )
        results = await asyncio.gather(*waits)
        assert results == [int(run.id, 16) % 97 for run in runs]
        # a read per arrival of notices (each batch forms while the last is in flight),
        # not one per wait
        assert wire.statements < len(runs) // 2, wire.queries()
        await _settle(queue, first, notice=True)
        assert await holder is None


async def test_a_read_asked_while_a_batch_is_in_flight_sees_what_committed_before_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read never joins a batch already sent: it would answer from a snapshot taken
    before the read was asked. The first batch's statement runs and its answer is held;
    meanwhile the run settles, and a read asked now must see it settled."""
    async with AsyncQueue("default", settings=settings) as queue:
        run = await queue.enqueue(noop, 7)
        real = queue.store.runs.get_many
        answered, release = asyncio.Event(), asyncio.Event()
        batches: list[list[str]] = []

        async def held(run_ids: list[str]) -> list[Any]:
            rows = await real(run_ids)
            batches.append(run_ids)
            if len(batches) == 1:
                answered.set()
                await release.wait()
            return rows

        monkeypatch.setattr(queue.store.runs, "get_many", held)
        early = asyncio.create_task(queue.authorized(run.id))
        await asyncio.wait_for(answered.wait(), 10)  # its statement ran: still pending there
        await _settle(queue, run, notice=False)
        late = asyncio.create_task(queue.authorized(run.id))
        await asyncio.sleep(0.05)
        release.set()
        assert (await early).status is RunStatus.PENDING
        assert (await late).status is RunStatus.COMPLETED
        assert batches == [[run.id], [run.id]]


async def test_a_read_inside_a_transaction_is_the_transactions_own(settings: Settings) -> None:
    """Inside ``store.transaction()`` a read is made on that transaction's connection (it
    sees the transaction's own writes), never joined to other tasks' reads."""
    async with AsyncQueue("default", settings=settings) as queue:
        run = await queue.enqueue(noop, 8)
        async with queue.store.transaction() as conn:
            await conn.execute(
                "UPDATE runfleet.runs SET priority = 5 WHERE id = %(id)s", {"id": run.id}
            )
            assert (await queue.authorized(run.id)).priority == 5
            raise psycopg.Rollback()
        assert (await queue.authorized(run.id)).priority == 0
