"""Fairness across real worker processes: one key's 5,000-run burst and another key's 10
runs admitted later share a queue's slots round-robin, so the 10 start within a bound
while the burst is still draining (docs/how-to/queues.md "Concurrency keys")."""

from __future__ import annotations

import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn
from tests.support.polling import until

pytestmark = pytest.mark.chaos

BURST = 5000
LATE = 10
SLOTS = 4
NAP_MS = 200
BOUND_S = 20.0
"""The late key's 10 start within this of their admission. Round-robin gives them every
other freed slot: ~20 starts of 4 slots of 0.2 s bodies, about 1 s unloaded; the rest is
slack for a loaded 2-core box. Without the keys they would wait for the burst: 5,000
bodies over 4 slots, over four minutes."""
FLOW = "tests.queues.flows:tenant_nap"


async def test_a_late_key_starts_while_a_burst_drains(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    await store.queues.set("tenants", concurrency=SLOTS, key_flow=(FLOW, "kwargs.t"))
    procs = [spawn(flows="tests.queues.flows", queues="tenants", concurrency=4) for _ in range(3)]
    for proc in procs:
        await proc.wait_started()
    async with AsyncQueue("tenants", settings=settings) as q:
        for _ in range(BURST // 1000):
            await q.enqueue_many(
                [
                    EnqueueSpec(qf.tenant_nap, kwargs={"t": "acme", "ms": NAP_MS})
                    for _ in range(1000)
                ]
            )

        async def burst_draining() -> bool:
            return (await store.queues.keys("tenants", "acme"))[0].running >= 1

        await until(burst_draining, 60, "the burst to start")
        admitted_ms = await store.stats.now_ms()
        late = await q.enqueue_many(
            [EnqueueSpec(qf.tenant_nap, kwargs={"t": "bolt", "ms": NAP_MS}) for _ in range(LATE)]
        )
    late_ids = {r.id for r in late}

    async def all_late_started() -> bool:
        rows = await store.runs.get_many(list(late_ids))
        return all(r.status is not RunStatus.PENDING for r in rows)

    await until(all_late_started, BOUND_S + 60, "the late key's runs to start")
    started = [
        r.at_ms
        for r in await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED)
        if r.run_id in late_ids and isinstance(r.payload, dict) and r.payload.get("epoch") == 1
    ]
    assert len(started) == LATE
    took_s = (max(started) - admitted_ms) / 1000
    (acme,) = await store.queues.keys("tenants", "acme")
    print(
        f"fairness: the late key's {LATE} runs started within {took_s:.2f} s of their "
        f"admission; {acme.waiting} of the burst's {BURST} still waiting"
    )
    assert acme.waiting > BURST // 2, "the burst was still draining"
    assert took_s <= BOUND_S, (took_s, BOUND_S)


UNKEYED_BURST = 1500
UNKEYED_NAP_MS = 50
UNKEYED_SLOTS = 2
UNKEYED_BOUND_S = 5.0
"""The keyed run starts within this of its admission: its key's turn is older than the
no-key bucket's, so it takes the next slot a delivery offers the queue (one 50 ms body
unloaded); the rest is slack for a loaded 2-core box. Without the bucket it waits for
the whole burst: 1,500 bodies of 50 ms over 2 slots, over 37 s."""
UNKEYED_FLOW = "tests.queues.flows:nap"


async def test_unkeyed_runs_cannot_starve_a_keyed_one(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    """A queue keyed by ``scope``; 1,500 runs of a flow with no key expression are
    admitted first; a keyed run of a tenant admitted later starts within the bound while
    most of the burst still waits: unkeyed runs share the no-key bucket, which takes its
    turn like any key (docs/how-to/queues.md)."""
    await store.queues.set("tenants", key_flow=(FLOW, "scope"))
    proc = spawn(flows="tests.queues.flows", queues="tenants", concurrency=UNKEYED_SLOTS)
    await proc.wait_started()
    async with AsyncQueue("tenants", settings=settings, scopes=["warm"]) as warm:
        # The worker resolves the keyed plain function once: a key's turn starts only runs
        # of flows the worker runs (docs/how-to/queues.md).
        await (await warm.enqueue(qf.tenant_nap, kwargs={"t": "warm", "ms": 1})).result(30)
    async with AsyncQueue("tenants", settings=settings) as q:
        burst = await q.enqueue_many(
            [EnqueueSpec(qf.nap, (UNKEYED_NAP_MS,)) for _ in range(UNKEYED_BURST)]
        )
    burst_ids = [r.id for r in burst]

    async def burst_started() -> int:
        rows = await store.runs.get_many(burst_ids[:50])
        return sum(r.status is not RunStatus.PENDING for r in rows)

    await until(burst_started, 60, "the burst to start", accept=lambda n: n >= 1)
    async with AsyncQueue("tenants", settings=settings, scopes=["bolt"]) as tenant:
        admitted_ms = await store.stats.now_ms()
        keyed = await tenant.enqueue(qf.tenant_nap, kwargs={"t": "bolt", "ms": 1})
    row = await store.runs.get(keyed.id)
    assert row is not None and row.concurrency_key == "bolt", row

    async def keyed_started() -> bool:
        started = await store.runs.get(keyed.id)
        return started is not None and started.status is not RunStatus.PENDING

    await until(keyed_started, UNKEYED_BOUND_S + 60, "the keyed run to start")
    (activated,) = [
        r for r in await store.journal.records(keyed.id) if r.kind == Kind.CLAIMED_AND_ACTIVATED
    ]
    took_s = (activated.at_ms - admitted_ms) / 1000
    rows = await store.runs.get_many(burst_ids)
    waiting = sum(r.status is RunStatus.PENDING for r in rows)
    print(
        f"fairness: a keyed run started {took_s:.2f} s after its admission behind "
        f"{UNKEYED_BURST} unkeyed runs; {waiting} of them still waiting"
    )
    assert waiting > UNKEYED_BURST // 2, "the burst was still draining"
    assert took_s <= UNKEYED_BOUND_S, (took_s, UNKEYED_BOUND_S)
