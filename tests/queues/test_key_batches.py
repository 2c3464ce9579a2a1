"""A keyed queue's turns for a whole claim batch (real Postgres): the batch claim takes keyed
runs, K per key and round-robin across keys as the single claim decides them (one rule:
runfleet.key_pick_many); within a key the highest priority starts first; keys at their
limit do not use up a claim's visits, so a free key's run starts whatever the number of
saturated keys."""

from __future__ import annotations

import asyncio
from collections import Counter

import psycopg

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Activated, NewRun, Owner, RunRow, RunStatus, Transitioned
from tests.support.polling import until

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, tenant: str, priority: int | None = None) -> RunRow:
    created = await store.admission.create(
        NewRun(
            id=run_id,
            flow=FLOW,
            queue="shared",
            payload={"args": [1], "kwargs": {"t": tenant}},
            priority=priority,
        )
    )
    return created.row


async def running_per_key(store: Store) -> dict[str, int]:
    keys = await store.queues.keys("shared", limit=1000)
    return {k.key: k.running for k in keys if k.running}


async def test_a_batch_of_keyed_runs_starts_k_per_key_round_robin(store: Store) -> None:
    """Eight deliveries of one key's burst, K = 2, two other keys waiting: one statement
    starts 2 of the burst and the other keys' runs in the burst's spare slots; the
    runs whose slots went to another key stay pending, the rest wait for their key."""
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=2)
    burst = [await admit(store, f"a{i}", "acme") for i in range(8)]
    await admit(store, "b0", "bolt")
    await admit(store, "c0", "crux")
    await admit(store, "c1", "crux")
    await admit(store, "c2", "crux")
    outcomes = await store.runs.claim_and_activate_many(burst, ME, ahead_flows=[FLOW])
    started = [o.row for o in outcomes.values() if isinstance(o, Activated)]
    assert len(started) == len({r.id for r in started})  # never one run in two slots
    assert Counter(r.concurrency_key for r in started) == {"acme": 2, "bolt": 1, "crux": 2}
    assert sorted(r.id for r in started if r.concurrency_key == "crux") == ["c0", "c1"]  # FIFO
    assert await running_per_key(store) == {"acme": 2, "bolt": 1, "crux": 2}
    # The next batch honours what is running: acme and crux are full, bolt has no run left.
    rest = [r for r in burst if r.id not in {s.id for s in started}]  # still pending
    assert len(rest) == 6
    again = await store.runs.claim_and_activate_many(rest, ME, ahead_flows=[FLOW])
    assert not [o for o in again.values() if isinstance(o, Activated)]
    assert await running_per_key(store) == {"acme": 2, "bolt": 1, "crux": 2}


async def test_within_a_key_the_highest_priority_starts_first(store: Store) -> None:
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=1)
    low = [await admit(store, f"a{i}", "acme") for i in range(3)]
    await admit(store, "hi", "acme", priority=5)  # admitted last
    took = (await store.runs.claim_if_fresh("a0", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(took, Activated) and took.row.id == "hi"
    a0 = await store.runs.get("a0")
    assert a0 is not None and a0.status is RunStatus.PENDING
    settled = await store.lifecycle.transition_owned("hi", ME, took.row.epoch, RunStatus.COMPLETED)
    assert isinstance(settled, Transitioned)
    # The batch path: a later high priority of the key takes the key's one slot too.
    await admit(store, "hi2", "acme", priority=3)
    batch = await store.runs.claim_and_activate_many(low, ME, ahead_flows=[FLOW])
    assert [(k, o.row.id) for k, o in batch.items() if isinstance(o, Activated)] == [("a0", "hi2")]


async def test_a_free_key_starts_behind_more_than_64_saturated_keys(store: Store) -> None:
    """70 keys each at its limit (K = 1) with a run waiting, one key with a free slot and
    the newest turn: a delivery of a saturated key's run starts the free key's run."""
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=1)
    for i in range(70):
        first = await admit(store, f"k{i:02}-0", f"k{i:02}")
        await admit(store, f"k{i:02}-1", f"k{i:02}")
        out = (await store.runs.claim_if_fresh(first.id, FLOW, ME, ahead_flows=[FLOW])).outcome
        assert isinstance(out, Activated)
    z0 = await admit(store, "z0", "zed")
    out = (await store.runs.claim_if_fresh(z0.id, FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(out, Activated) and out.row.id == "z0"
    settled = await store.lifecycle.transition_owned("z0", ME, out.row.epoch, RunStatus.COMPLETED)
    assert isinstance(settled, Transitioned)  # zed: a free slot, and the newest turn
    await admit(store, "z1", "zed")
    running = await running_per_key(store)
    assert len(running) == 70 and set(running.values()) == {1}
    took = (await store.runs.claim_if_fresh("k00-1", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(took, Activated) and took.row.id == "z1", took
    await admit(store, "z2", "zed")  # and the batch path, zed full again: nothing starts
    k01 = await store.runs.get("k01-1")
    assert k01 is not None
    batch = await store.runs.claim_and_activate_many([k01], ME, ahead_flows=[FLOW])
    assert not isinstance(batch["k01-1"], Activated)


async def test_two_workers_batches_racing_on_one_key(store: Store, settings: Settings) -> None:
    """Two workers' batch claims of one key's runs (K = 3), released together from behind
    a held queue lock: 3 start in all, each once, whichever wins."""
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=3)
    rows = [await admit(store, f"a{i:02}", "acme") for i in range(12)]
    others = [await Store.open(settings) for _ in range(2)]
    owners = [Owner("host-b", 100, "n0"), Owner("host-c", 200, "n1")]
    try:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as barrier:
            async with barrier.transaction():
                await barrier.execute(
                    "SELECT FROM runfleet.queues WHERE name = 'shared' FOR UPDATE"
                )
                claims = [
                    asyncio.create_task(
                        others[i].runs.claim_and_activate_many(
                            rows[i::2] + rows[1 - i :: 2][:2], owners[i], ahead_flows=[FLOW]
                        )
                    )
                    for i in range(2)
                ]

                async def waiting() -> int:
                    cur = await barrier.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    found = await cur.fetchone()
                    return 0 if found is None else int(found[0])

                await until(
                    waiting,
                    30,
                    "both batch claims waiting on the queue's lock",
                    accept=lambda n: n >= 2,
                )
            first, second = await asyncio.gather(*claims)
    finally:
        for other in others:
            await other.close()
    won = [o.row.id for o in (*first.values(), *second.values()) if isinstance(o, Activated)]
    assert len(won) == 3 and len(set(won)) == 3, (first, second)
    assert await running_per_key(store) == {"acme": 3}
