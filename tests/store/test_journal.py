"""The journal: idempotent addressed emits, owner-fenced emits, and reading records back."""

from __future__ import annotations

import logging

import pytest

from runfleet.store import Kind, Store
from runfleet.store import journal_records as jr
from runfleet.store.journal import _append_params, evidence_address
from runfleet.store.types import Accepted, Conflict, Duplicate, RunStatus
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    count,
    create,
    journal_kinds,
    make_running,
)


async def test_emit_is_idempotent_per_address(store: Store, database_url: str) -> None:
    await create(store, "r1")
    payload = jr.ClaimRecovered(claimant="c", probe_detail={"alive": True, "at": 5})
    first = await store.journal.emit("r1", payload, source_id="sweep")
    assert isinstance(first, Accepted)
    reordered = jr.ClaimRecovered(claimant="c", probe_detail={"at": 5, "alive": True})
    again = await store.journal.emit("r1", reordered, source_id="sweep")
    assert again == Duplicate(first.seq)
    assert (await journal_kinds(store, "r1")).count("claim-recovered") == 1
    approved = await store.journal.emit("r1", jr.ApprovalApproved(token="t"), source_id="ok")
    assert isinstance(approved, Accepted)
    before = await count(database_url, "journal")
    denied = jr.ApprovalDenied(token="t")  # another kind, the same payload
    assert await store.journal.emit("r1", denied, source_id="ok") == Duplicate(approved.seq)
    assert await count(database_url, "journal") == before


async def test_emit_of_a_different_payload_at_a_used_address_is_a_logged_conflict(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    await create(store, "r1")
    one, two = jr.StepCompensated(key="1"), jr.StepCompensated(key="2")
    first = await store.journal.emit("r1", one, source_id="src", source_seq=7)
    assert isinstance(first, Accepted)
    with caplog.at_level(logging.WARNING, logger="runfleet.store.journal"):
        clash = await store.journal.emit("r1", two, source_id="src", source_seq=7)
    assert clash == Conflict(first.seq, {"key": "1"})
    assert any(r.getMessage() == "journal.idempotency_conflict" for r in caplog.records)
    records = [r for r in await store.journal.records("r1") if r.kind == Kind.STEP_COMPENSATED]
    assert [r.payload for r in records] == [{"key": "1"}]


async def test_emit_at_distinct_addresses_appends(store: Store) -> None:
    await create(store, "r1")
    same = jr.StepCompensated(key="v")
    outcomes = [
        await store.journal.emit("r1", same, source_id="src", source_seq=1),
        await store.journal.emit("r1", same, source_id="src", source_seq=2),
        await store.journal.emit("r1", same, source_id="other", source_seq=1),
    ]
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert len({o.seq for o in outcomes}) == 3


async def test_evidence_address_is_stable_per_lease_and_kind() -> None:
    one = evidence_address("r1", OWNER_A, 100, "probe")
    assert one == evidence_address("r1", OWNER_A, 100, "probe")
    variants = {
        evidence_address("r2", OWNER_A, 100, "probe"),
        evidence_address("r1", OWNER_B, 100, "probe"),
        evidence_address("r1", OWNER_A, 101, "probe"),
        evidence_address("r1", OWNER_A, 100, "lease-fresh"),
        evidence_address("r1", None, 100, "probe"),
    }
    assert one not in variants and len(variants) == 5


async def test_emit_owned_lands_only_under_the_current_fence(store: Store) -> None:
    await make_running(store, "r1")
    quote = jr.StepCompensated(key="quote")
    seq = await store.journal.emit_owned("r1", OWNER_A, 1, quote)
    assert seq is not None
    record = (await store.journal.last("r1", limit=1))[0]
    assert (record.seq, record.kind, record.payload) == (seq, "step-compensated", {"key": "quote"})
    assert record.source_id == store.db.source_id

    assert await store.journal.emit_owned("r1", OWNER_B, 1, quote) is None
    assert await store.journal.emit_owned("r1", OWNER_A, 2, quote) is None
    assert await store.journal.emit_owned("ghost", OWNER_A, 1, quote) is None
    await store.lifecycle.transition_owned("r1", OWNER_A, 1, RunStatus.COMPLETED)
    assert await store.journal.emit_owned("r1", OWNER_A, 1, quote) is None
    assert (await journal_kinds(store, "r1")).count("step-compensated") == 1


async def test_records_and_last_read_in_sequence_order(store: Store) -> None:
    await create(store, "r1")
    await create(store, "r2")
    five = [jr.Claimed(), jr.Activated(), jr.Woken(), jr.ClockFired(), jr.EventSet()]
    k0, k1, k2, k3, k4 = (p.KIND for p in five)
    for n, payload in enumerate(five):
        await store.journal.emit("r1", payload, source_id="t", source_seq=n)
        await store.journal.emit("r2", jr.StepCompensated(key=str(n)), source_id="u", source_seq=n)
    every = await store.journal.records("r1")
    assert [r.kind for r in every] == ["created", k0, k1, k2, k3, k4]
    assert all(r.run_id == "r1" for r in every)
    seqs = [r.seq for r in every]
    assert seqs == sorted(seqs)
    assert every[0].at_ms > 0

    after = await store.journal.records("r1", after_seq=every[2].seq, limit=2)
    assert [r.kind for r in after] == [k2, k3]
    assert [r.kind for r in await store.journal.last("r1", limit=3)] == [k2, k3, k4]
    assert [r.kind for r in await store.journal.last("r1")] == [r.kind for r in every]
    assert await store.journal.records("ghost") == [] and await store.journal.last("ghost") == []


async def test_a_stores_own_records_use_its_source_in_sequence(store: Store) -> None:
    await create(store, "r1")
    await make_running(store, "r2")
    own = [r for r in await store.journal.records("r1") + await store.journal.records("r2")]
    assert {r.source_id for r in own} == {store.db.source_id}
    seqs = [r.source_seq for r in own]
    assert len(set(seqs)) == len(seqs) and seqs == sorted(seqs)


async def test_a_record_reads_its_kind_as_a_kind_and_an_unknown_one_as_its_string(
    store: Store,
) -> None:
    """A newer version's (or a hand-written) kind still reads: as the stored string."""
    await create(store, "r1")
    await store.db.one(
        "journal.append", _append_params([("r1", "made-up-by-v9", "v9", 1, {"a": 1})])
    )
    created, unknown = await store.journal.records("r1")
    assert created.kind is Kind.CREATED
    assert unknown.kind == "made-up-by-v9" and not isinstance(unknown.kind, Kind)
    assert unknown.payload == {"a": 1}
