"""A tenant's row lock holds a worker's statement on that run for ``worker_lock_wait_ms`` at
most (docs/explanation/trust-model.md).

A producer may ``SELECT ... FOR UPDATE`` its own runs' rows with its own login and raw SQL.
A batch statement of the worker skips such a row (tests/security/test_tenant_locks.py);
each statement that names one run — the claim of a lone delivery, a takeover's steal, a
settlement done alone, a release — gives up on it after the bound and sets that run
aside, so the tenant's lock never takes the worker's slot, nor its connections, from
another tenant's runs. Real worker processes, logged in as a runfleet_worker login, and
tenants' producer logins made as ``runfleet roles`` makes them.
"""

from __future__ import annotations

import signal
import time

import psycopg

from runfleet.producer import AsyncQueue
from runfleet.store.journal_records import Kind
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn
from tests.security.conftest import MakeLogin
from tests.security.test_tenant_locks import LOCK_OWN_ROW, kinds, running
from tests.support.polling import until

LOCK_OWN_ROWS = "SELECT id FROM runfleet.runs WHERE id = ANY(%s) FOR UPDATE"


async def test_a_locked_pending_run_delivered_alone_does_not_take_the_slot(
    login: MakeLogin, spawn: Spawn
) -> None:
    """One slot: tenant A's locked pending run is the only run the next read delivers (the
    one-run claim). The claim gives up on the row and sets the run aside, so tenant B's
    run admitted behind it starts while A still holds its row; A's starts once it is
    free."""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    worker = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=1)
    await worker.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        busy = await qb.enqueue("sec.slow", 1.5, run_id="b-busy")
        await until(running(busy), 15, "tenant B's first run to take the one slot")
        held = await qa.enqueue("sec.slow", 0.1, run_id="a-held")  # waits for the slot
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROW, ("a-held",))
            behind = await qb.enqueue("sec.slow", 0.1, run_id="b-behind")
            assert await busy.result(timeout=15) == "rested"
            assert await behind.result(timeout=8) == "rested"  # while A still holds its row
            assert (await held.fetch()).status is RunStatus.PENDING
            await raw.rollback()
        assert await held.result(timeout=40) == "rested"  # delayed, not lost
    log = worker.log()
    assert "run.set_aside" in log, log[-3000:]
    assert "lease.lapsed" not in log, log[-3000:]
    assert worker.proc.poll() is None, log[-3000:]


async def test_a_locked_running_run_does_not_hold_the_takeover_of_others(
    login: MakeLogin, spawn: Spawn
) -> None:
    """A first worker runs tenant A's run and two of tenant B's and is SIGKILLed; A locks
    its run's row. A second worker with one slot takes the three over, stalest first and
    A's first (one renewal gave them one lease; ids break the tie): its steal gives up on
    A's row and sets the run aside, B's runs are taken over and complete while A still
    holds its row, and A's is taken over once the row is free."""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    first = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=4)
    await first.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        own = await qa.enqueue("sec.slow", 2.0, run_id="a-own")
        others = [await qb.enqueue("sec.slow", 2.0, run_id=f"b-{i}") for i in range(2)]
        for run in (own, *others):
            await until(running(run), 15, f"{run.id} to start on the first worker")
        first.signal(signal.SIGKILL)
        await first.wait_exit()
        # One lease for the three, as one renewal gives them (the first worker may have been
        # killed between claims, before a renewal evened them out): the id breaks the tie.
        async with await psycopg.AsyncConnection.connect(fleet.url, autocommit=True) as admin:
            await admin.execute(
                "UPDATE runfleet.runs SET heartbeat_at_ms = (SELECT min(heartbeat_at_ms)"
                " FROM runfleet.runs WHERE id = ANY(%(ids)s)) WHERE id = ANY(%(ids)s)",
                {"ids": ["a-own", "b-0", "b-1"]},
            )
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROW, ("a-own",))
            second = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=1)
            await second.wait_started()
            # Well before a steal waiting on A's row would give up on its own (a statement
            # timeout of 30 s), while A still holds its row:
            deadline = time.monotonic() + 25
            for run in others:
                assert await run.result(timeout=max(0.1, deadline - time.monotonic())) == "rested"
                assert Kind.STOLEN_AND_ACTIVATED in await kinds(qb, run.id)
            assert (await own.fetch()).status is RunStatus.RUNNING
            await raw.rollback()
        assert await own.result(timeout=40) == "rested"  # delayed, not lost
        assert Kind.STOLEN_AND_ACTIVATED in await kinds(qa, own.id)
    log = second.log()
    assert "run.set_aside" in log, log[-3000:]
    assert "lease.lapsed" not in log, log[-3000:]
    assert second.proc.poll() is None, log[-3000:]


async def test_locked_settling_runs_do_not_take_the_workers_connections(
    login: MakeLogin, spawn: Spawn
) -> None:
    """A worker with a pool of 4 connections: tenant A locks its 4 running runs' rows as
    their bodies end, so each is settled alone. Each lone settlement gives up on its row
    after the bound and is tried again, holding no connection meanwhile: tenant B's
    running runs record their steps and settle, and a run B admits meanwhile is claimed
    and completes, all while A holds its rows; A's settle once the rows are free."""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    worker = spawn(
        flows="tests.security.flows",
        database_url=fleet.url,
        concurrency=8,
        pool_max=4,
        heartbeat_interval=1.0,
        stale_after=10.0,  # A's runs do not lapse alone while held: the settlement is tried
    )
    await worker.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        held = [await qa.enqueue("sec.slow", 1.0, run_id=f"a-{i}") for i in range(4)]
        others = [await qb.enqueue("sec.slow", 3.0, run_id=f"b-{i}") for i in range(2)]
        for run in (*held, *others):
            await until(running(run), 15, f"{run.id} to start")
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROWS, ([run.id for run in held],))
            for run in others:  # while A still holds its rows
                assert await run.result(timeout=10) == "rested"
            later = await qb.enqueue("sec.slow", 0.1, run_id="b-later")
            assert await later.result(timeout=10) == "rested"
            for run in held:
                assert (await run.fetch()).status is RunStatus.RUNNING
            await raw.rollback()
        for run in held:
            assert await run.result(timeout=20) == "rested"  # delayed, not lost
            assert (await kinds(qa, run.id)).count(Kind.CLAIMED_AND_ACTIVATED) == 1
    log = worker.log()
    assert "run.set_aside" in log, log[-3000:]
    assert "lease.lapsed" not in log, log[-3000:]


async def test_locked_runs_do_not_hold_the_release_of_others_at_shutdown(
    login: MakeLogin, spawn: Spawn
) -> None:
    """A worker with a pool of 4 connections stops (SIGTERM) while tenant A holds its 4
    running runs' rows: each of A's releases gives up on its row after the bound and is
    tried again, holding no connection meanwhile, so tenant B's 2 running runs are
    released (journaled, their wakes handed back) before the worker exits, not left to a
    takeover. (A's runs are released once their rows are free, or, past the stop's
    deadline, left to a takeover as after a kill.)"""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    worker = spawn(
        flows="tests.security.flows",
        database_url=fleet.url,
        concurrency=8,
        pool_max=4,
        grace_period=0.5,  # the bodies are interrupted at once: their releases are tried
    )
    await worker.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        held = [await qa.enqueue("sec.slow", 30.0, run_id=f"a-{i}") for i in range(4)]
        others = [await qb.enqueue("sec.slow", 30.0, run_id=f"b-{i}") for i in range(2)]
        for run in (*held, *others):
            await until(running(run), 15, f"{run.id} to start")
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROWS, ([run.id for run in held],))
            worker.signal(signal.SIGTERM)
            await worker.wait_exit(timeout=30)
            for run in others:  # released by the stopping worker, while A holds its rows
                row = await run.fetch()
                assert row.status is RunStatus.SUSPENDED and row.owner is None, row
                assert Kind.INTERRUPT_RELEASED in await kinds(qb, run.id)
            await raw.rollback()
    log = worker.log()
    assert "run.set_aside" in log, log[-3000:]
