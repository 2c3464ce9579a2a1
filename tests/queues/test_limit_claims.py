"""A queue's fleet-wide concurrency limit, decided by the claim statements (real Postgres):
at most N runs of it execute at once whichever claim path starts them; a settled or parked
run frees its slot, a takeover keeps it; concurrent claimants never overshoot."""

from __future__ import annotations

import asyncio

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    Activated,
    AtLimit,
    NewRun,
    Owner,
    RunRow,
    RunStatus,
    Transitioned,
)

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, queue: str = "serial") -> RunRow:
    created = await store.admission.create(
        NewRun(id=run_id, flow=FLOW, queue=queue, payload={"args": [1]})
    )
    return created.row


async def test_every_claim_path_stops_at_the_limit(store: Store) -> None:
    await store.queues.set("serial", concurrency=2)
    rows = [await admit(store, f"r{i}") for i in range(5)]
    one = (await store.runs.claim_if_fresh("r0", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(one, Activated) and one.row.limited
    two = await store.runs.claim_and_activate("r1", rows[1].snapshot, ME)
    assert isinstance(two, Activated)
    refused = (await store.runs.claim_if_fresh("r2", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(refused, AtLimit)
    assert isinstance(await store.runs.claim_and_activate("r2", rows[2].snapshot, ME), AtLimit)
    batch = await store.runs.claim_and_activate_many(rows[2:], ME, ahead_flows=[FLOW])
    assert all(isinstance(o, AtLimit) for o in batch.values())
    # Settling one frees one slot: a batch then starts exactly one more.
    settled = await store.lifecycle.transition_owned("r0", ME, one.row.epoch, RunStatus.COMPLETED)
    assert isinstance(settled, Transitioned)
    batch = await store.runs.claim_and_activate_many(rows[2:], ME, ahead_flows=[FLOW])
    assert sorted(k for k, o in batch.items() if isinstance(o, Activated)) == ["r2"]
    assert (await store.queues.running(["serial"])) == {"serial": 2}
    # Lifting the limit (0) lets the rest start; another queue never was limited.
    await store.queues.set("serial", concurrency=0)
    batch = await store.runs.claim_and_activate_many(rows[3:], ME, ahead_flows=[FLOW])
    assert all(isinstance(o, Activated) and not o.row.limited for o in batch.values())
    (changed, *_) = await store.queues.changes("serial")
    assert changed.change == {"concurrency": None} and changed.changed_by


async def test_concurrent_claimants_never_overshoot(store: Store, settings: Settings) -> None:
    await store.queues.set("serial", concurrency=3)
    rows = [await admit(store, f"c{i}") for i in range(40)]
    others = [await Store.open(settings) for _ in range(4)]
    try:
        owners = [Owner("host-b", 100 + i, f"n{i}") for i in range(4)]

        async def claim_all(i: int) -> int:
            won = 0
            for row in rows[i::4]:
                if i % 2:
                    out = (await others[i].runs.claim_if_fresh(row.id, FLOW, owners[i])).outcome
                else:
                    out = (await others[i].runs.claim_and_activate_many([row], owners[i]))[row.id]
                won += isinstance(out, Activated)
            return won

        wins = await asyncio.gather(*(claim_all(i) for i in range(4)))
    finally:
        for other in others:
            await other.close()
    assert sum(wins) == 3
    assert (await store.queues.running(["serial"])) == {"serial": 3}
