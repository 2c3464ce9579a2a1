"""Concurrency keys, decided by the claim statements (real Postgres): the database keys a
run at admission from its flow's expression; at most K runs of a key execute at once; a
delivery is a slot offered to the queue, and the key whose last start is oldest takes it;
per-key rates; the limits are journaled with who set them and explained."""

from __future__ import annotations

import json

import pytest

from runfleet.ops.cli.common import connect
from runfleet.ops.dashboard.data import JournalTail, overview
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.queues import NO_KEY
from runfleet.store.types import Activated, AtLimit, NewRun, Owner, RunRow, RunStatus, Transitioned
from tests.ops.conftest import cli_env, invoke

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, tenant: str, queue: str = "shared") -> RunRow:
    created = await store.admission.create(
        NewRun(id=run_id, flow=FLOW, queue=queue, payload={"args": [1], "kwargs": {"t": tenant}})
    )
    return created.row


async def claim(store: Store, run_id: str) -> object:
    return (await store.runs.claim_if_fresh(run_id, FLOW, ME, ahead_flows=[FLOW])).outcome


async def test_the_database_keys_runs_from_the_flows_expression(store: Store) -> None:
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=1)
    a = await admit(store, "a0", "acme")
    assert a.concurrency_key == "acme"
    other = await store.admission.create(
        NewRun(id="n0", flow="tests.queues.flows:other", queue="shared", payload={"args": []})
    )
    # A flow with no expression on a keyed queue: the no-key bucket, one key for them all.
    assert other.row.concurrency_key == NO_KEY
    plain = await store.admission.create(
        NewRun(id="p0", flow="tests.queues.flows:other", queue="plain", payload={"args": []})
    )
    assert plain.row.concurrency_key is None  # a queue that is not keyed keys nothing
    await store.queues.set("shared", key_flow=(FLOW, "args.0"))
    assert (await admit(store, "a1", "acme")).concurrency_key == "1"
    with pytest.raises(InvalidInput):
        await store.queues.set("shared", key_flow=(FLOW, "payload; DROP TABLE runs"))
    (changed, *_) = await store.queues.changes("shared")
    assert changed.change == {"key": {"flow": FLOW, "expression": "args.0"}}
    assert changed.changed_by


async def test_unkeyed_runs_take_one_turn_between_them(store: Store) -> None:
    """Runs of a flow with no key expression on a keyed queue share the no-key bucket: a
    delivery of one of them is a slot offered to the queue, and a keyed run whose turn
    is older takes it, in the single claim and in the batch claim."""
    unkeyed = "tests.queues.flows:other"
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"))
    for i in range(6):
        await store.admission.create(
            NewRun(id=f"u{i}", flow=unkeyed, queue="shared", payload={"args": []})
        )
    await admit(store, "b0", "bolt")
    await admit(store, "c0", "cold")
    flows = [FLOW, unkeyed]

    async def claim_named(run_id: str) -> object:
        return (await store.runs.claim_if_fresh(run_id, unkeyed, ME, ahead_flows=flows)).outcome

    first = await claim_named("u0")  # the bucket's turn ('' sorts first among new keys)
    assert isinstance(first, Activated) and first.row.id == "u0"
    took = await claim_named("u1")  # bolt has the older turn now: it takes u1's slot
    assert isinstance(took, Activated) and took.row.id == "b0", took
    u = [await store.runs.get(f"u{i}") for i in (2, 3, 4)]
    batch = await store.runs.claim_and_activate_many(
        [r for r in u if r is not None], ME, ahead_flows=flows
    )
    started = sorted(a.row.id for a in batch.values() if isinstance(a, Activated))
    assert started == ["c0", "u1", "u2"], started  # one of each key with work per pass


async def test_at_most_k_per_key_and_the_oldest_key_takes_the_slot(store: Store) -> None:
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_concurrency=2)
    for i in range(5):
        await admit(store, f"a{i}", "acme")
    one, two = await claim(store, "a0"), await claim(store, "a1")
    assert isinstance(one, Activated) and isinstance(two, Activated)
    assert isinstance(await claim(store, "a2"), AtLimit)  # acme holds its 2
    await admit(store, "b0", "bolt")
    # acme's delivery is a slot offered to the queue: bolt (never started) takes it.
    took = await claim(store, "a3")
    assert isinstance(took, Activated) and took.row.id == "b0"
    a3 = await store.runs.get("a3")
    assert a3 is not None and a3.status is RunStatus.PENDING
    # A settled acme run frees one acme slot; the other paths honour the key limit too.
    assert isinstance(one, Activated)
    settled = await store.lifecycle.transition_owned("a0", ME, one.row.epoch, RunStatus.COMPLETED)
    assert isinstance(settled, Transitioned)
    a3 = await store.runs.get("a3")
    assert a3 is not None
    assert isinstance(await store.runs.claim_and_activate("a3", a3.snapshot, ME), Activated)
    a4 = await store.runs.get("a4")
    assert a4 is not None
    assert isinstance(await store.runs.claim_and_activate("a4", a4.snapshot, ME), AtLimit)
    batch = await store.runs.claim_and_activate_many([a4], ME, ahead_flows=[FLOW])
    assert isinstance(batch["a4"], AtLimit)  # the batch claim honours the key's limit too
    keys = {k.key: k for k in await store.queues.keys("shared")}
    assert (keys["acme"].running, keys["acme"].waiting) == (2, 2)  # a1, a3; a2, a4
    assert (keys["bolt"].running, keys["bolt"].waiting) == (1, 0)


async def test_round_robin_across_keys_under_a_queue_limit(store: Store) -> None:
    """Three keys, one of them a burst, a queue of 3 slots: the starts alternate keys."""
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), concurrency=3)
    for i in range(20):
        await admit(store, f"a{i:02}", "acme")
    await admit(store, "b0", "bolt")
    await admit(store, "c0", "crux")
    started: list[str] = []
    for i in range(3):  # every delivery is acme's (its wakes come first)
        outcome = await claim(store, f"a{i:02}")
        assert isinstance(outcome, Activated)
        started.append(outcome.row.concurrency_key or "")
    assert sorted(started) == ["acme", "bolt", "crux"], started
    assert isinstance(await claim(store, "a05"), AtLimit)  # the queue's 3 are in use


async def test_a_key_rate_and_explain(store: Store, settings: Settings) -> None:
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), key_rate_per_s=0.2)
    for i in range(2):
        await admit(store, f"a{i}", "acme")
    assert isinstance(await claim(store, "a0"), Activated)  # the key's full bucket: 1
    refused = await claim(store, "a1")
    assert isinstance(refused, AtLimit)
    assert refused.retry_after_ms is not None and 3000 < refused.retry_after_ms <= 5000
    (acme,) = await store.queues.keys("shared", "acme")
    assert acme.wait_ms is not None and 3000 < acme.wait_ms <= 5000
    explained = await invoke(cli_env(settings), "explain", "a1")
    assert "waiting for the rate limit of key acme of queue shared (0.2/s per key): " in (
        explained.stdout
    ), explained
    shown = await invoke(cli_env(settings), "queue", "show", "shared")
    assert (
        f"keys: {FLOW} by kwargs.t" in shown.stdout and "acme: 1 running, 1 waiting" in shown.stdout
    ), shown


async def test_explain_names_the_key_slot_a_run_waits_for(store: Store, settings: Settings) -> None:
    shown = await invoke(
        cli_env(settings),
        "queue",
        "set",
        "shared",
        "--key",
        f"{FLOW}=kwargs.t",
        "--key-concurrency",
        "1",
    )
    assert shown.code == 0 and "1 per key" in shown.stdout, shown
    await admit(store, "a0", "acme")
    await admit(store, "a1", "acme")
    assert isinstance(await claim(store, "a0"), Activated)
    assert isinstance(await claim(store, "a1"), AtLimit)
    explained = await invoke(cli_env(settings), "explain", "a1")
    assert "waiting for a slot of key acme of queue shared: 1 of 1 in use" in explained.stdout, (
        explained
    )


async def test_fleet_and_the_dashboard_show_a_keyed_queue(store: Store, settings: Settings) -> None:
    await store.queues.set(
        "shared", key_flow=(FLOW, "kwargs.t"), concurrency=4, key_concurrency=1, note="fair"
    )
    await admit(store, "a0", "acme")
    await admit(store, "a1", "acme")
    assert isinstance(await claim(store, "a0"), Activated)
    env = cli_env(settings)
    text = await invoke(env, "fleet")
    assert "queue shared: 1/4 slots in use, keyed (round-robin, 1 per key)" in text.stdout, text
    assert "key acme: 1 running, 1 waiting" in text.stdout, text
    shown = await invoke(env, "fleet", "--json")
    (queue,) = json.loads(shown.stdout)["queues"]
    assert queue["keys"] == [{"key": "acme", "running": 1, "waiting": 1, "next_token_ms": None}]
    (change, *_) = await store.queues.changes("shared")
    assert change.note == "fair" and change.changed_by  # journaled with who did it
    async with connect(settings, redis="optional") as conns:
        view = await overview(conns, JournalTail())
    (limits,) = view.limits
    assert (limits.name, limits.running, limits.concurrency) == ("shared", 1, 4)
    assert [(k.key, k.running, k.waiting) for k in limits.keys] == [("acme", 1, 1)]
