"""Priorities at claim time (store level, real Postgres): the claim statements let a fresh
run of a higher priority take the slot a delivery offered, FIFO within a priority, unless
the delivered run has out-aged it; a run-level, flow-level and queue-level priority."""

from __future__ import annotations

import psycopg
import pytest

from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import Activated, Created, NewRun, Owner, RunRow, RunStatus

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, priority: int | None = None, queue: str = "q") -> RunRow:
    created = await store.admission.create(
        NewRun(id=run_id, flow=FLOW, queue=queue, payload={"args": [1]}, priority=priority)
    )
    return created.row


async def test_a_delivery_claims_the_highest_priority_run_first(store: Store) -> None:
    named = await admit(store, "low-1")
    await admit(store, "low-2")
    await admit(store, "high-old", priority=5)
    await admit(store, "high-new", priority=5)
    await admit(store, "top", priority=9)
    order = []
    for _ in range(3):  # every delivery names low-1: the slot goes by priority, then FIFO
        fresh_claim = await store.runs.claim_if_fresh(named.id, FLOW, ME, ahead_flows=[FLOW])
        outcome, seen = fresh_claim.outcome, fresh_claim.seen
        assert isinstance(outcome, Activated) and seen is not None and seen.id == "low-1"
        order.append(outcome.row.id)
    assert order == ["top", "high-old", "high-new"]
    low = await store.runs.get("low-1")
    assert low is not None and low.status is RunStatus.PENDING
    (record,) = [
        r for r in await store.journal.records("top") if r.kind == Kind.CLAIMED_AND_ACTIVATED
    ]
    assert isinstance(record.payload, dict) and record.payload["ahead_of"] == "low-1"
    # Nothing higher left: the delivered run itself, then the next by its own delivery.
    outcome = (await store.runs.claim_if_fresh("low-1", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(outcome, Activated) and outcome.row.id == "low-1"


async def test_without_ahead_flows_or_of_another_queue_nothing_overtakes(store: Store) -> None:
    await admit(store, "low")
    await admit(store, "high", priority=3)
    await admit(store, "elsewhere", priority=9, queue="other")
    outcome = (await store.runs.claim_if_fresh("low", FLOW, ME)).outcome  # tools: no look-ahead
    assert isinstance(outcome, Activated) and outcome.row.id == "low"
    await admit(store, "low-b")
    outcome = (
        await store.runs.claim_if_fresh("low-b", FLOW, ME, ahead_flows=["other:flow"])
    ).outcome
    assert isinstance(outcome, Activated) and outcome.row.id == "low-b"  # a flow it lacks
    await admit(store, "low-c")
    outcome = (await store.runs.claim_if_fresh("low-c", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(outcome, Activated) and outcome.row.id == "high"  # not 'elsewhere'


async def test_aging_a_long_wait_outranks_a_small_priority_gap(
    store: Store, settings: Settings
) -> None:
    old = await admit(store, "patient")
    young = await admit(store, "eager", priority=2)
    assert old.priority == 0 and young.priority == 2
    # Two priority points are worth two minutes of waiting: the patient run was admitted
    # three minutes before the eager one (stands in for three minutes of real waiting).
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "UPDATE runfleet.runs SET created_at_ms = created_at_ms - 180000 WHERE id = 'patient'"
        )
    outcome = (await store.runs.claim_if_fresh("patient", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(outcome, Activated) and outcome.row.id == "patient"


async def test_a_batch_claim_gives_its_slots_to_the_highest_priorities(store: Store) -> None:
    lows = [await admit(store, f"low-{i}") for i in range(3)]
    for name, p in (("mid", 2), ("top", 8)):
        await admit(store, name, priority=p)
    outcomes = await store.runs.claim_and_activate_many(lows, ME, ahead_flows=[FLOW])
    taken = {named: o.row.id for named, o in outcomes.items() if isinstance(o, Activated)}
    assert set(taken) == {"low-0", "low-1", "low-2"}
    # The newest low runs gave their slots away; the oldest low keeps its own.
    assert taken == {"low-2": "top", "low-1": "mid", "low-0": "low-0"}
    statuses = {r.id: r.status for r in await store.runs.get_many(["low-1", "low-2"])}
    assert statuses == {"low-1": RunStatus.PENDING, "low-2": RunStatus.PENDING}


async def test_defaults_come_from_the_call_then_the_flow_then_the_queue(store: Store) -> None:
    await store.queues.set("prio-q", default_priority=4, note="test")
    row = await admit(store, "by-queue", queue="prio-q")
    assert row.priority == 4
    row = await admit(store, "by-call", priority=-3, queue="prio-q")
    assert row.priority == -3
    row = await admit(store, "plain", queue="other-q")
    assert row.priority == 0
    with pytest.raises(InvalidInput) as info:
        await admit(store, "bad", priority=10_000_000)
    assert info.value.field == "priority"


async def test_a_batch_takes_the_best_candidates_when_more_wait_than_it_has_slots(
    store: Store,
) -> None:
    lows = [await admit(store, f"low-{i}") for i in range(2)]
    for name, p in (("two", 2), ("eight", 8), ("five", 5)):
        await admit(store, name, priority=p)
    outcomes = await store.runs.claim_and_activate_many(lows, ME, ahead_flows=[FLOW])
    taken = {o.row.id for o in outcomes.values() if isinstance(o, Activated)}
    assert taken == {"eight", "five"}


async def test_an_admission_reads_its_queues_default_itself(
    store: Store, database_url: str
) -> None:
    """runfleet.admit (a batch) and runfleet.admit_one (a single enqueue) take the queue's
    default in their own INSERT (migration 0035): runs_default_priority, a trigger call per
    row, is not what gives a producer's run its priority (disabled here, they still do)."""
    await store.queues.set("prio-q", default_priority=4, note="test")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE runfleet.runs DISABLE TRIGGER runs_default_priority")
    single = await store.admission.create(NewRun(id="single", flow=FLOW, queue="prio-q"))
    batch = await store.admission.admit_each(
        [NewRun(id=f"batch-{i}", flow=FLOW, queue="prio-q") for i in range(2)]
        + [NewRun(id="called", flow=FLOW, queue="prio-q", priority=-3)]
        + [NewRun(id="elsewhere", flow=FLOW, queue="other-q")]
    )
    rows = {o.row.id: o.row for o in [single, *batch] if isinstance(o, Created)}
    assert {i: r.priority for i, r in rows.items()} == {
        "single": 4,
        "batch-0": 4,
        "batch-1": 4,
        "called": -3,
        "elsewhere": 0,
    }
