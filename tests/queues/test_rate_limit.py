"""Rate limits: a token bucket per queue in Postgres, taken by the claim statements.

Store level: the bucket holds one second's starts, refusals say when the next token
comes, and explain says so. Fleet level: three real worker processes on one rate-limited
queue start R runs a second within 5 % over the measured window."""

from __future__ import annotations

import pytest

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
