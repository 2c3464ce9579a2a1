"""The run DAG: durable edges, cycle refusal that leaves no trace, and the cycle race."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import FlowCycleDetected
from runfleet.store.types import EdgeExisting, EdgeRecorded
from tests.store.helpers import count, extra_stores, journal_kinds, race

ITERATIONS = 50


async def _edges(store: Store, child: str) -> list[str]:
    return [e.parent_id for e in await store.dag.parents(child)]


async def test_record_parent_records_once(store: Store) -> None:
    first = await store.dag.record_parent("child", "parent")
    assert isinstance(first, EdgeRecorded)
    assert (first.edge.child_id, first.edge.parent_id) == ("child", "parent")
    again = await store.dag.record_parent("child", "parent")
    assert again == EdgeExisting(first.edge)
    records = await store.journal.records("child")
    assert [(r.kind, r.payload) for r in records] == [("parent-recorded", {"parent": "parent"})]


async def test_a_cycle_is_refused_with_its_path_and_leaves_no_trace(
    store: Store, database_url: str
) -> None:
    await store.dag.record_parent("b", "a")
    await store.dag.record_parent("c", "b")
    edges_before = await count(database_url, "run_parents")
    journal_before = await count(database_url, "journal")

    with pytest.raises(FlowCycleDetected) as caught:
        await store.dag.record_parent("a", "c")

    assert caught.value.path == ["a", "c", "b", "a"]
    assert await _edges(store, "a") == []
    assert await count(database_url, "run_parents") == edges_before
    assert await count(database_url, "journal") == journal_before
    assert await journal_kinds(store, "a") == []


async def test_a_self_edge_is_a_cycle(store: Store, database_url: str) -> None:
    with pytest.raises(FlowCycleDetected) as caught:
        await store.dag.record_parent("a", "a")
    assert caught.value.path == ["a", "a"]
    assert await count(database_url, "run_parents") == 0


async def test_a_diamond_is_not_a_cycle(store: Store) -> None:
    for child, parent in [("l", "top"), ("r", "top"), ("bottom", "l"), ("bottom", "r")]:
        assert isinstance(await store.dag.record_parent(child, parent), EdgeRecorded)
    assert await _edges(store, "bottom") == ["l", "r"]


async def test_a_refused_cycle_inside_a_transaction_spares_the_rest(store: Store) -> None:
    async with store.transaction():
        await store.dag.record_parent("b", "a")
        with pytest.raises(FlowCycleDetected):
            await store.dag.record_parent("a", "b")
        await store.dag.record_parent("c", "b")
    assert await _edges(store, "b") == ["a"]
    assert await _edges(store, "c") == ["b"]
    assert await _edges(store, "a") == []


async def test_parents_and_children_in_recording_order(store: Store) -> None:
    for parent in ("p3", "p1", "p2"):
        await store.dag.record_parent("kid", parent)
    for child in ("k2", "k3"):
        await store.dag.record_parent(child, "p1")
    assert await _edges(store, "kid") == ["p3", "p1", "p2"]
    assert [e.child_id for e in await store.dag.children("p1")] == ["kid", "k2", "k3"]
    seqs = [e.seq for e in await store.dag.parents("kid")]
    assert seqs == sorted(seqs)
    assert await store.dag.parents("nobody") == [] and await store.dag.children("nobody") == []


async def test_remove_edges_drops_every_edge_touching_the_run(store: Store) -> None:
    await store.dag.record_parent("mid", "top")
    await store.dag.record_parent("low", "mid")
    await store.dag.record_parent("other", "top")
    assert await store.dag.remove_edges("mid") == 2
    assert await _edges(store, "mid") == [] and await store.dag.children("mid") == []
    assert await _edges(store, "low") == []
    assert await _edges(store, "other") == ["top"]
    assert await store.dag.remove_edges("mid") == 0
    # With the edges gone, the reverse direction is no longer a cycle.
    assert isinstance(await store.dag.record_parent("top", "mid"), EdgeRecorded)


async def _add_edge_when_all_are_open(
    store: Store, barrier: asyncio.Barrier, child: str, parent: str
) -> EdgeRecorded | EdgeExisting | FlowCycleDetected:
    """One edge in its own transaction, inserted only once every racer's is open."""
    try:
        async with store.transaction():
            await barrier.wait()
            return await store.dag.record_parent(child, parent)
    except FlowCycleDetected as refused:
        return refused


@pytest.mark.parametrize("length", [2, 3])
async def test_race_transactions_that_jointly_close_a_cycle(
    settings: Settings, store: Store, database_url: str, length: int
) -> None:
    """Each transaction adds one edge of a ring; all are open before any inserts."""
    async with extra_stores(settings, length) as stores:
        for i in range(ITERATIONS):
            ring = [f"n{i}-{k}" for k in range(length)]
            barrier = asyncio.Barrier(length)
            edges = [(ring[(k + 1) % length], ring[k]) for k in range(length)]
            outcomes = await race(
                [
                    partial(_add_edge_when_all_are_open, s, barrier, c, p)
                    for s, (c, p) in zip(stores, edges, strict=True)
                ]
            )
            failed = [o for o in outcomes if isinstance(o, FlowCycleDetected)]
            assert len(failed) == 1, outcomes
            assert sum(isinstance(o, EdgeRecorded) for o in outcomes) == length - 1
            survivors = [n for n in ring if await _edges(store, n)]
            assert len(survivors) == length - 1
            closing = failed[0].path
            assert closing[0] == closing[-1] and sorted(set(closing)) == sorted(ring)
    assert await count(database_url, "run_parents") == ITERATIONS * (length - 1)
