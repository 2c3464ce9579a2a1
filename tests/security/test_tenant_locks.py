"""Locks a tenant can take never stall the fleet (docs/explanation/trust-model.md).

Each test does what a hostile tenant can do with its own login and raw SQL: a producer
may ``SELECT ... FOR UPDATE`` its own runs' rows (it has UPDATE on them), and any login
may take any advisory lock. Real worker processes (or, for retention and the statistics
refresh, the store a worker runs them on), logged in as runfleet_worker.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from datetime import timedelta

import psycopg
import pytest

from runfleet.producer import AsyncQueue
from runfleet.producer.queue import AsyncRun
from runfleet.store import Store
from runfleet.store.journal_records import Kind
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from runfleet.worker.retention import RetentionLoop
from tests.fleet.procs import Spawn
from tests.security.conftest import MakeLogin
from tests.store.helpers import committed_rows_counted
from tests.support.polling import until

LOCK_OWN_ROW = "SELECT id FROM runfleet.runs WHERE id = %s FOR UPDATE"


def running(run: AsyncRun) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        row = await run.fetch()
        return row.status is RunStatus.RUNNING and row.owner is not None

    return check


async def kinds(q: AsyncQueue, run_id: str) -> list[str]:
    return [r.kind for r in await q.store.journal.records(run_id, limit=200)]


async def test_a_producer_locking_its_own_running_run_never_lapses_the_worker(
    login: MakeLogin, spawn: Spawn
) -> None:
    """Tenant A holds its running run's row for 3.5 s (stale_after is 1 s) while the worker
    executes two runs of tenant B: the worker neither lapses nor exits, B's runs run once,
    and A's own run is only delayed (it lapses alone, is released, and completes)."""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    worker = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=8)
    await worker.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        own = await qa.enqueue("sec.slow", 1.5, run_id="a-own")
        await until(running(own), 15, "tenant A's run to start")
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROW, ("a-own",))
            others = [await qb.enqueue("sec.slow", 2.0, run_id=f"b-{i}") for i in range(2)]
            for run in others:
                await until(running(run), 10, f"{run.id} to start beside the locked row")
            await asyncio.sleep(3.5)  # the hostile part: the lock is held past stale_after
            await raw.rollback()
        for run in others:
            assert await run.result(timeout=30) == "rested"
            journal = await kinds(qb, run.id)
            assert journal.count(Kind.CLAIMED_AND_ACTIVATED) == 1, journal
            assert Kind.STOLEN_AND_ACTIVATED not in journal, journal
            assert Kind.INTERRUPT_RELEASED not in journal, journal
        assert await own.result(timeout=30) == "rested"  # delayed, not lost
    assert worker.proc.poll() is None, worker.log()[-3000:]
    log = worker.log()
    assert "lease.lapsed" not in log, log[-3000:]
    assert "lease.renew_skipped" in log, log[-3000:]


async def test_a_producer_locking_its_settling_run_does_not_hold_other_settlements(
    login: MakeLogin, spawn: Spawn
) -> None:
    """Tenant A locks its running run's row before its body ends, beside two runs of
    tenant B ending at the same time: B's settle while A still holds the row (a batch
    settlement leaves the locked row out), and A's settles once the row is free. (A lease
    of 10 s, so that A's run does not lapse alone while its row is held: its settlement
    is what is tried here.)"""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    worker = spawn(
        flows="tests.security.flows",
        database_url=fleet.url,
        concurrency=8,
        heartbeat_interval=1.0,
        stale_after=10.0,
    )
    await worker.wait_started()
    async with (
        AsyncQueue("default", settings=a.settings, scopes=["s1"]) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"]) as qb,
    ):
        own = await qa.enqueue("sec.slow", 1.5, run_id="a-ends")
        others = [await qb.enqueue("sec.slow", 1.5, run_id=f"b-{i}") for i in range(2)]
        for run in (own, *others):
            await until(running(run), 10, f"{run.id} to start")
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROW, ("a-ends",))
            for run in others:  # while A still holds its row
                assert await run.result(timeout=4) == "rested"
            assert (await own.fetch()).status is RunStatus.RUNNING
            await raw.rollback()
        assert await own.result(timeout=20) == "rested"
        for run in (own, *others):
            journal = await kinds(qa if run is own else qb, run.id)
            assert journal.count(Kind.CLAIMED_AND_ACTIVATED) == 1, journal
    log = worker.log()
    assert "lease.lapsed" not in log, log[-3000:]
    assert "run.settle_alone_locked" in log, log[-3000:]  # the batch left it out


async def test_a_locked_pending_run_does_not_hold_another_tenants_claims(
    login: MakeLogin, spawn: Spawn, store: Store
) -> None:
    """Tenant A's pending run is locked on a queue limited to 4, delivered in the same
    stream read as tenant B's 3 runs: B's runs start at once, A's waits for its lock."""
    await store.queues.set("default", concurrency=4)
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    async with (  # admitted before any worker registered the flow
        AsyncQueue("default", settings=a.settings, scopes=["s1"], late_binding=True) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"], late_binding=True) as qb,
    ):
        held = await qa.enqueue("sec.slow", 0.1, run_id="a-pending")
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(LOCK_OWN_ROW, ("a-pending",))
            others = [await qb.enqueue("sec.slow", 0.5, run_id=f"b-{i}") for i in range(3)]
            worker = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=8)
            await worker.wait_started()
            for run in others:  # while A still holds its row
                assert await run.result(timeout=10) == "rested"
            assert (await held.fetch()).status is RunStatus.PENDING
            await raw.rollback()
        assert await held.result(timeout=40) == "rested"  # delayed, not lost


@pytest.mark.parametrize("group", [GroupRole.PRODUCER, GroupRole.OPERATOR])
async def test_no_producer_or_operator_login_can_stop_the_sweeps(
    login: MakeLogin, spawn: Spawn, group: GroupRole
) -> None:
    """A producer's or the read-only operator's login holds every advisory lock the sweeps
    once took, and cannot take their leases: a SIGKILLed worker's run is still taken over
    and a delayed run still starts."""
    fleet = await login(GroupRole.WORKER)
    tenant = await login(GroupRole.PRODUCER, "s1")
    hostile = await login(group, "s1")
    async with await psycopg.AsyncConnection.connect(hostile.url, autocommit=True) as raw:
        for kind in range(1, 9):
            cur = await raw.execute("SELECT pg_try_advisory_lock(732011, %s)", (kind,))
            assert (await cur.fetchone()) == (True,)
        first = spawn(flows="tests.security.flows", database_url=fleet.url)
        await first.wait_started()
        async with AsyncQueue("default", settings=tenant.settings, scopes=["s1"]) as q:
            killed = await q.enqueue("sec.slow", 2.0, run_id="orphan")
            await until(running(killed), 15, "the first worker to own the run")
            first.signal(signal.SIGKILL)
            await first.wait_exit()
            second = spawn(flows="tests.security.flows", database_url=fleet.url)
            await second.wait_started()
            later = await q.enqueue_in(timedelta(seconds=1), "sec.slow", 0.1, run_id="later")
            assert await killed.result(timeout=20) == "rested"
            assert Kind.STOLEN_AND_ACTIVATED in await kinds(q, killed.id)
            assert await later.result(timeout=20) == "rested"
        for take in (  # nor can it take what decides who sweeps now
            "SELECT kind FROM runfleet.sweep_leases FOR UPDATE SKIP LOCKED",
            "SELECT kind FROM runfleet.sweep_leases FOR KEY SHARE",
            "LOCK TABLE runfleet.sweep_leases IN ACCESS SHARE MODE",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                async with raw.transaction():
                    await raw.execute(take)


async def test_more_locked_pending_runs_than_slots_do_not_take_every_slot(
    login: MakeLogin, spawn: Spawn
) -> None:
    """Tenant A holds 8 of its pending runs locked, twice the worker's 4 slots: no claim
    waits on them (batch or single), so tenant B's 3 runs start at once; A's start once
    their rows are free (the lost-wake sweep brings them back)."""
    fleet = await login(GroupRole.WORKER)
    a = await login(GroupRole.PRODUCER, "s1")
    b = await login(GroupRole.PRODUCER, "s2")
    async with (  # admitted before any worker registered the flow
        AsyncQueue("default", settings=a.settings, scopes=["s1"], late_binding=True) as qa,
        AsyncQueue("default", settings=b.settings, scopes=["s2"], late_binding=True) as qb,
    ):
        held = [await qa.enqueue("sec.slow", 0.1, run_id=f"a-{i}") for i in range(8)]
        async with await psycopg.AsyncConnection.connect(a.url) as raw:
            await raw.execute(
                "SELECT id FROM runfleet.runs WHERE id = ANY(%s) FOR UPDATE",
                ([run.id for run in held],),
            )
            worker = spawn(flows="tests.security.flows", database_url=fleet.url, concurrency=4)
            await worker.wait_started()
            others = [await qb.enqueue("sec.slow", 0.2, run_id=f"b-{i}") for i in range(3)]
            for run in others:  # while A still holds its rows
                assert await run.result(timeout=10) == "rested"
            await raw.rollback()
        for run in held:
            assert await run.result(timeout=40) == "rested"  # delayed, not lost


AGED = """
INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, round_ordinal,
                           created_at_ms, updated_at_ms)
SELECT 'aged-' || g, 'f.x', 'q', 'completed', '{}'::jsonb, 'aged-' || g, 0, 1, 1
  FROM generate_series(1, 3000) g
"""


@pytest.mark.parametrize("group", [GroupRole.PRODUCER, GroupRole.OPERATOR])
async def test_no_producer_or_operator_login_can_stop_retention_or_the_statistics_refresh(
    login: MakeLogin, database_url: str, group: GroupRole
) -> None:
    """A producer's or the read-only operator's login holds the advisory locks retention's
    pass and the statistics refresh once took (732012, 732013), and cannot take their
    leases: a worker's retention pass still prunes 3,000 expired runs and its refresh
    still analyzes the table they grew."""
    fleet = await login(GroupRole.WORKER)
    hostile = await login(group, "s1")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute(AGED)
    await committed_rows_counted(database_url, "runfleet.runs", 3000)
    async with await psycopg.AsyncConnection.connect(hostile.url, autocommit=True) as raw:
        for key in (732012, 732013):
            cur = await raw.execute("SELECT pg_try_advisory_lock(%s, 1)", (key,))
            assert (await cur.fetchone()) == (True,)
        store = await Store.open(fleet.settings, min_size=1, max_size=2)
        try:
            assert "runs" in [a.table for a in await store.sweeps.analyze_grown()]
            aged = fleet.settings.model_copy(update={"retention": 0.001})
            done = await RetentionLoop(store, aged, None, [], batch=5000).tick()
            assert done is not None and done.deleted.runs == 3000, done
        finally:
            await store.close()
        for take in (  # nor can it take what decides who prunes and who analyzes now
            "SELECT FROM runfleet.sweep_leases WHERE name = 'retention' FOR UPDATE",
            "UPDATE runfleet.sweep_leases SET holder = 'me', held_until_ms = 9e15"
            " WHERE name = 'retention'",
            "SELECT FROM runfleet.sweep_leases WHERE name = 'statistics' FOR UPDATE SKIP LOCKED",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                async with raw.transaction():
                    await raw.execute(take)


@pytest.mark.parametrize("group", [GroupRole.PRODUCER, GroupRole.OPERATOR])
async def test_no_producer_or_operator_login_can_stop_child_admissions(
    login: MakeLogin, spawn: Spawn, group: GroupRole
) -> None:
    """A producer's or the read-only operator's login holds the advisory lock every parent
    edge insert once took (7320112026), and cannot take the row that serializes them now:
    a worker's run still admits its child, which completes, and so does the run."""
    fleet = await login(GroupRole.WORKER)
    tenant = await login(GroupRole.PRODUCER, "s1")
    hostile = await login(group, "s1")
    async with await psycopg.AsyncConnection.connect(hostile.url, autocommit=True) as raw:
        cur = await raw.execute("SELECT pg_try_advisory_lock(7320112026)")
        assert (await cur.fetchone()) == (True,)
        worker = spawn(flows="tests.security.flows", database_url=fleet.url)
        await worker.wait_started()
        async with AsyncQueue("default", settings=tenant.settings, scopes=["s1"]) as q:
            run = await q.enqueue("sec.parent", 21, run_id="with-child")
            assert await run.result(timeout=10) == 42
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            async with raw.transaction():
                await raw.execute("SELECT FROM runfleet.sweep_leases WHERE name = 'dag' FOR UPDATE")
