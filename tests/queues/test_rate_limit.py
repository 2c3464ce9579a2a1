"""Rate limits: a token bucket per queue in Postgres, taken by the claim statements.

Store level: the bucket holds one second's starts, refusals say when the next token
comes, and explain says so. Fleet level: three real worker processes on one rate-limited
queue start R runs a second within 5 % over the measured window."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from psycopg import AsyncConnection

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import Activated, AtLimit, NewRun, Owner
from tests.fleet.procs import Spawn
from tests.ops.conftest import cli_env, invoke
from tests.support.polling import until

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def test_the_bucket_holds_one_seconds_starts(store: Store, settings: Settings) -> None:
    await store.queues.set("metered", rate_per_s=2)
    for i in range(4):
        await store.admission.create(NewRun(id=f"m{i}", flow=FLOW, queue="metered"))
    started = []
    for i in range(3):
        outcome = (await store.runs.claim_if_fresh(f"m{i}", FLOW, ME)).outcome
        started.append(outcome)
    assert [type(o) for o in started] == [Activated, Activated, AtLimit]
    refused = started[2]
    assert isinstance(refused, AtLimit) and refused.retry_after_ms is not None
    assert 0 < refused.retry_after_ms <= 500

    async def a_token() -> bool:
        return (await store.queues.wait_ms("metered")) == 0

    await until(a_token, 5, "the next token")
    outcome = (await store.runs.claim_if_fresh("m2", FLOW, ME)).outcome
    assert isinstance(outcome, Activated)
    shown = await invoke(cli_env(settings), "queue", "set", "metered", "--rate", "12/m")
    assert "rate 0.2/s" in shown.stdout, shown  # a token every 5 s, a bucket of one
    outcome = (await store.runs.claim_if_fresh("m3", FLOW, ME)).outcome
    assert isinstance(outcome, Activated)
    await store.admission.create(NewRun(id="m4", flow=FLOW, queue="metered"))
    refused = (await store.runs.claim_if_fresh("m4", FLOW, ME)).outcome
    assert isinstance(refused, AtLimit) and refused.retry_after_ms is not None
    assert 3000 < refused.retry_after_ms <= 5000
    explained = await invoke(cli_env(settings), "explain", "m4")
    assert "waiting for the rate limit of queue metered (0.2/s fleet-wide): next token in" in (
        explained.stdout
    ), explained
    bad = await invoke(cli_env(settings), "queue", "set", "metered", "--rate", "5/week")
    assert bad.code == 1 and "period" in bad.stderr


@asynccontextmanager
async def _queue_row_held(database_url: str, queue: str) -> AsyncIterator[AsyncConnection]:
    """Another transaction holding ``queue``'s row (as a claim in flight does): every claim
    of the queue waits for it in runfleet.queue_free_slots, before any run row's lock."""
    conn = await AsyncConnection.connect(database_url)
    try:
        await conn.execute(
            "SELECT FROM runfleet.queues WHERE name = %s FOR UPDATE", (queue,), prepare=False
        )
        yield conn
    finally:
        await conn.rollback()
        await conn.close()


async def _waiting_on_locks(database_url: str, n: int) -> None:
    async def waiting() -> bool:
        async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            return row is not None and row[0] >= n

    await until(waiting, 10, f"{n} claims waiting on the queue's row")


async def _tokens(store: Store) -> int:
    bucket = await store.queues.bucket("metered")
    assert bucket is not None
    return bucket[0]


async def test_a_claim_that_loses_its_race_hands_its_token_back(
    store: Store, database_url: str
) -> None:
    """Two wakes of one run (its gated wake and the lost-wake sweep's) claimed at once: both
    statements see the run fresh and ask a token, one starts it, and the other's token
    goes back (runfleet.rate_refund). Taken and kept, it was a start lost: three workers
    held 4/s at 87.7 %. Made to happen: both claims wait behind the queue row's lock, so
    the second takes its token only after the first committed the run's start."""
    await store.queues.set("metered", rate_per_s=2)  # a bucket of 2, refilled every 0.5 s
    for run_id in ("x", "y"):
        await store.admission.create(NewRun(id=run_id, flow=FLOW, queue="metered"))
    other = Owner("host-b", 4343, "nonce-b")
    async with _queue_row_held(database_url, "metered") as holder:
        racing = asyncio.gather(
            store.runs.claim_if_fresh("x", FLOW, ME), store.runs.claim_if_fresh("x", FLOW, other)
        )
        await _waiting_on_locks(database_url, 2)
        await holder.rollback()
        claims = await racing
    outcomes = [type(c.outcome) for c in claims]
    assert sorted(o.__name__ for o in outcomes) == ["Activated", "SnapshotChanged"], outcomes
    assert await _tokens(store) == 1  # kept, the loser's token left 0 (refilled at 0.5 s)
    assert isinstance((await store.runs.claim_if_fresh("y", FLOW, ME)).outcome, Activated)


async def test_a_claim_by_snapshot_that_loses_its_race_hands_its_token_back(
    store: Store, database_url: str
) -> None:
    """The same race through ``claim_and_activate`` (a resume, a released run): the slot is
    asked once, before the run row is locked, and the loser's token goes back. Asked in
    the UPDATE's WHERE, it was taken, the changed row re-checked, and the token kept."""
    await store.queues.set("metered", rate_per_s=2)
    for run_id in ("x", "y"):
        await store.admission.create(NewRun(id=run_id, flow=FLOW, queue="metered"))
    seen = await store.runs.get("x")
    assert seen is not None
    other = Owner("host-b", 4343, "nonce-b")
    async with _queue_row_held(database_url, "metered") as holder:
        racing = asyncio.gather(
            store.runs.claim_and_activate("x", seen.snapshot, ME),
            store.runs.claim_and_activate("x", seen.snapshot, other),
        )
        await _waiting_on_locks(database_url, 2)
        await holder.rollback()
        outcomes = await racing
    assert sorted(type(o).__name__ for o in outcomes) == ["Activated", "SnapshotChanged"]
    assert await _tokens(store) == 1
    again = await store.runs.get("y")
    assert again is not None
    assert isinstance(await store.runs.claim_and_activate("y", again.snapshot, ME), Activated)


async def test_a_batch_claim_hands_back_the_tokens_of_runs_it_did_not_start(
    store: Store, database_url: str
) -> None:
    """The batch claim (claim_and_activate_many) asks a token for every run its snapshot
    shows fresh; a run another batch started first, or one it skipped locked, leaves its
    token unused: it goes back, per queue, in the same statement."""
    await store.queues.set("metered", rate_per_s=3)
    for run_id in ("a", "b", "c"):
        await store.admission.create(NewRun(id=run_id, flow=FLOW, queue="metered"))
    rows = await store.runs.get_many(["a", "b"])
    other = Owner("host-b", 4343, "nonce-b")
    async with _queue_row_held(database_url, "metered") as holder:
        racing = asyncio.gather(
            store.runs.claim_and_activate_many(rows, ME),
            store.runs.claim_and_activate_many(rows, other),
        )
        await _waiting_on_locks(database_url, 2)
        await holder.rollback()
        first, second = await racing
    started = [o for batch in (first, second) for o in batch.values() if isinstance(o, Activated)]
    assert len(started) == 2, (first, second)  # each run once
    assert await _tokens(store) == 1  # 3 - the 2 starts; kept, the loser's 2 left none
    assert isinstance((await store.runs.claim_if_fresh("c", FLOW, ME)).outcome, Activated)


RATE = 4.0
WINDOW_S = 60.0
NAP_MS = 1000


@pytest.mark.chaos
async def test_three_workers_hold_the_rate_within_five_percent(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    """The issue's bound: R/s within 5 % over a minute across three worker processes.

    The fleet has room to spare (24 slots for ~4 bodies of 1 s at once), so what is
    measured is the rate, not the workers' capacity; the backlog outlasts the window, so
    there is always a run to start. The test it replaces (30 s, 5 s bodies: 20 of 24 slots
    busy at the rate) measured 92 % once under a full `make test`; a refused claim's timer
    then moved one gated wake however late it fired (worker.rate_pump now moves every
    accrued token's, tests/queues/test_rate_pump.py)."""
    await store.queues.set("metered", rate_per_s=RATE)
    procs = [spawn(flows="tests.queues.flows", queues="metered", concurrency=8) for _ in range(3)]
    for proc in procs:
        await proc.wait_started()
    total = int(RATE * (WINDOW_S + 30))
    async with AsyncQueue("metered", settings=settings) as q:
        await q.enqueue_many([EnqueueSpec(qf.nap, (NAP_MS,)) for _ in range(total)])

    async def started() -> list[int]:
        return [
            r.at_ms
            for r in await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
            if isinstance(r.payload, dict) and r.payload.get("epoch") == 1
        ]

    await until(lambda: _at_least(started, 5), 60, "the first starts")
    first = min(await started())

    async def window_closed() -> bool:  # by the database's clock, which stamps the records
        return await store.stats.now_ms() >= first + WINDOW_S * 1000 + 1000

    await until(window_closed, WINDOW_S + 60, "the end of the window")
    starts = await started()
    in_window = [t for t in starts if first <= t < first + WINDOW_S * 1000]
    expected = RATE * WINDOW_S + max(RATE, 1)  # the rate, plus the full bucket at the start
    print(
        f"rate: {len(in_window)} starts in {WINDOW_S:g} s at {RATE:g}/s, of {expected:g} "
        f"allowed ({len(in_window) / expected:.1%})"
    )
    assert len(starts) < total, "the backlog outlasted the window"
    assert len(in_window) <= expected, (len(in_window), expected)  # Postgres decides: exact
    assert len(in_window) >= 0.95 * expected, (len(in_window), expected)
    workers = {
        r.payload["owner"]
        for r in await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
        if isinstance(r.payload, dict)
    }
    assert len(workers) >= 2, "the rate was held by several workers, not one"


async def _at_least(read: object, n: int) -> bool:
    assert callable(read)
    return len(await read()) >= n
