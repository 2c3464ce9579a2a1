"""Threads sharing one sync ``Queue`` share admissions (``runtime.batching.ThreadGroupCommit``).

The first thread in leads: its batch goes out at once; threads that enqueue while it is
in flight follow, blocked, and go out together in the next statement. Counted on the
wire of the blocking pool's one connection: sixteen threads that queue up behind a busy
connection are admitted in two statements (the first thread's, gone out alone at once,
and the fifteen that queued behind it), each gets its own run, and one thread's
refused run (an id taken by another run) reaches that thread only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from runfleet.broker.streams import Lane
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import ExecutionIdentityConflict
from runfleet.store.journal import Kind
from runfleet.store.types import RunStatus
from tests.broker.test_sync_inline import noop, traced

THREADS = 16


def _pending(queue: Queue) -> int:
    """Threads queued for the normal lane's next batch (0 where no batch exists)."""
    groups: dict[Lane, Any] = getattr(queue._inline.queue(), "_thread_groups", {})
    group = groups.get(Lane.NORMAL)
    return len(group._pending) if group is not None else 0


async def test_threads_queued_behind_a_batch_share_one_statement_each_gets_its_own_answer(
    settings: Settings, store: Store
) -> None:
    answers: dict[int, object] = {}

    def enqueue(i: int, queue: Queue) -> None:
        try:
            if i == 5:  # an id another run holds, with other arguments: refused
                answers[i] = queue.enqueue(noop, 99, job_id="taken").id
            else:
                answers[i] = queue.enqueue(noop, i, job_id=f"thread-{i}").id
        except Exception as exc:
            answers[i] = exc

    def admit() -> int:
        with traced(settings) as (queue, wire):
            queue.enqueue(noop, 0, job_id="taken")
            pool = queue._inline.queue().store.db.blocking_pool  # type: ignore[attr-defined]  # store.inline's database
            threads = [threading.Thread(target=enqueue, args=(i, queue)) for i in range(THREADS)]
            with pool.connection():  # the one connection is busy: the threads queue up
                wire.reset()
                for thread in threads:
                    thread.start()
                deadline = time.monotonic() + 0.5
                while _pending(queue) < THREADS - 1 and time.monotonic() < deadline:
                    time.sleep(0.005)
            for thread in threads:
                thread.join(timeout=30)
            return wire.statements

    statements = await asyncio.to_thread(admit)
    assert statements < THREADS, f"{statements} statements for {THREADS} enqueues"
    # the first thread's batch went out at once, alone (no window to wait out); the
    # fifteen that queued while it was in flight shared the next statement
    assert statements == 2
    refused = answers.pop(5)
    assert isinstance(refused, ExecutionIdentityConflict), refused
    assert answers == {i: f"thread-{i}" for i in range(THREADS) if i != 5}
    for i in answers:
        row = await store.runs.get(f"thread-{i}")
        assert row is not None and row.status is RunStatus.PENDING
        assert row.payload == {"args": [i], "kwargs": {}}
        assert [r.kind for r in await store.journal.records(f"thread-{i}")] == [Kind.CREATED]
    taken = await store.runs.get("taken")
    assert taken is not None and taken.payload == {"args": [0], "kwargs": {}}


async def test_many_threads_enqueueing_at_once_admit_every_run_once(
    settings: Settings, store: Store
) -> None:
    per_thread = 25

    def admit() -> tuple[list[str], int]:
        ids: list[str] = []
        lock = threading.Lock()
        gate = threading.Barrier(THREADS)
        with Queue("default", settings=settings) as queue:

            def loop(t: int) -> None:
                gate.wait()
                for k in range(per_thread):
                    job = queue.enqueue(noop, k, job_id=f"t{t}-{k}")
                    with lock:
                        ids.append(job.id)

            threads = [threading.Thread(target=loop, args=(t,)) for t in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            return ids, queue._inline.queue()._thread_groups[Lane.NORMAL].flushes

    ids, flushes = await asyncio.to_thread(admit)
    calls = THREADS * per_thread
    assert sorted(ids) == sorted(f"t{t}-{k}" for t in range(THREADS) for k in range(per_thread))
    assert flushes < calls, f"{flushes} batches for {calls} enqueues"
    for run_id in ids:
        assert [r.kind for r in await store.journal.records(run_id)] == [Kind.CREATED]


@pytest.mark.parametrize("lead_interrupted", [False, True])
def test_a_failed_batch_reaches_its_callers_and_the_next_thread_leads(
    lead_interrupted: bool,
) -> None:
    from runfleet.runtime.batching import ThreadGroupCommit

    release = threading.Event()
    seen: list[list[int]] = []

    def flush(items: Any) -> list[int | BaseException]:
        seen.append(list(items))
        if len(seen) == 1:
            release.wait(5)
            raise (KeyboardInterrupt() if lead_interrupted else OSError("down"))
        return [ValueError(i) if i == 3 else i * 10 for i in items]

    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(flush, name="t")
    out: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            out[i] = group.submit(i)
        except BaseException as exc:
            out[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    while not seen:
        time.sleep(0.001)
    rest = [threading.Thread(target=call, args=(i,)) for i in (1, 2, 3)]
    for thread in rest:
        thread.start()
    while len(group._pending) < 3:
        time.sleep(0.001)
    release.set()
    for thread in [first, *rest]:
        thread.join(5)
    assert seen == [[0], [1, 2, 3]]
    assert isinstance(out[0], KeyboardInterrupt if lead_interrupted else OSError)
    assert out[1] == 10 and out[2] == 20
    assert isinstance(out[3], ValueError)
    assert group._leaders == 0 and group._pending == []


def test_a_forked_child_does_not_wait_for_its_parents_batch() -> None:
    """A process forked while a thread's batch is in flight (a pre-forking server that
    enqueued at import) admits its own runs: it does not queue behind a leader it lacks."""
    import os

    from runfleet.runtime.batching import ThreadGroupCommit

    release = threading.Event()

    def flush(items: Any) -> list[int]:
        if os.getpid() == parent:
            release.wait(5)
        return [i * 10 for i in items]

    parent = os.getpid()
    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(flush, name="t")
    leader = threading.Thread(target=group.submit, args=(1,))
    leader.start()
    while group._leaders == 0:
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:  # the child: its submit must not queue behind the parent's leader
        answer = threading.Thread(target=lambda: os._exit(0 if group.submit(2) == 20 else 1))
        answer.start()
        answer.join(5)
        os._exit(2)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        leader.join(5)
    assert os.waitstatus_to_exitcode(status) == 0
