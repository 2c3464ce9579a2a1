"""Fairness across real worker processes: one key's 5,000-run burst and another key's 10
runs admitted later share a queue's slots round-robin, so the 10 start within a bound
while the burst is still draining (docs/queues.md "Concurrency keys")."""

from __future__ import annotations

import pytest

import tests.queues.flows as qf
from runfleet.broker import AsyncQueue, EnqueueSpec
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
