"""Admission: create / join / identity conflicts, the ``created`` record, child admission, reads."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import ExecutionIdentityConflict, InvalidInput
from runfleet.store.types import (
    AdmissionOptions,
    CancelRequested,
    Created,
    Joined,
    NewRun,
    OnParentExit,
    RqOptions,
    RunStatus,
    Transitioned,
)
from tests.store.helpers import (
    OWNER_A,
    count,
    counts,
    create,
    db_now,
    extra_stores,
    journal_kinds,
    lock_waiters,
    make_running,
    must_get,
    race,
)
from tests.support.polling import until


class Boom(Exception):
    """Raised on purpose to roll back an outer transaction."""


async def test_create_admits_a_pending_row_with_its_state(store: Store) -> None:
    outcome = await store.admission.create(
        NewRun(
            id="r1",
            flow="orders.fulfil",
            queue="high",
            payload={"order": 42},
            scopes=("b", "a", "b"),
            max_rounds=3,
            options=AdmissionOptions(rq=RqOptions(meta={"note": "x"})),
        )
    )
    assert isinstance(outcome, Created)
    row = outcome.row
    assert (row.id, row.flow, row.queue, row.status) == (
        "r1",
        "orders.fulfil",
        "high",
        RunStatus.PENDING,
    )
    assert row.payload == {"order": 42}
    assert row.scopes == ("a", "b")
    assert row.state["max_rounds"] == 3 and row.state["meta"] == {"note": "x"}
    assert row.owner is None and row.claim is None and row.epoch == 0
    assert row.lineage_id == "r1" and row.round_ordinal == 0
    assert row.cancel_requested_at_ms is None and row.waiting is None
    assert row.created_at_ms == row.updated_at_ms > 0
    assert replace(await must_get(store, "r1"), now_ms=0) == replace(row, now_ms=0)


async def test_created_record_carries_flow_and_queue(store: Store) -> None:
    await create(store, "r1", flow="f")
    records = await store.journal.records("r1")
    assert [r.kind for r in records] == ["created"]
    assert records[0].payload == {"flow": "f", "queue": "default", "inherited_cancel": False}
    assert records[0].source_id == store.db.source_id


async def test_identical_readmission_joins_regardless_of_key_and_scope_order(
    store: Store,
) -> None:
    first = NewRun(
        id="r1", flow="f", payload={"a": 1, "b": {"x": [1, 2], "y": None}}, scopes=("s1", "s2")
    )
    created = await store.admission.create(first)
    assert isinstance(created, Created)
    again = NewRun(
        id="r1", flow="f", payload={"b": {"y": None, "x": [1, 2]}, "a": 1}, scopes=("s2", "s1")
    )
    joined = await store.admission.create(again)
    assert isinstance(joined, Joined)
    assert joined.row.id == "r1" and joined.row.created_at_ms == created.row.created_at_ms
    assert await journal_kinds(store, "r1") == ["created"]


async def test_join_sees_the_run_as_it_is_now(store: Store) -> None:
    await make_running(store, "r1", flow="f")
    joined = await store.admission.create(NewRun(id="r1", flow="f"))
    assert isinstance(joined, Joined)
    assert joined.row.status is RunStatus.RUNNING and joined.row.owner == OWNER_A


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        ("flow", {"flow": "other.flow"}),
        ("payload", {"payload": {"n": 2}}),
        ("scopes", {"scopes": ("s1",)}),
        ("lineage_id", {"lineage_id": "another-lineage"}),
        ("round_ordinal", {"round_ordinal": 1}),
    ],
)
async def test_readmission_with_a_different_identity_names_the_field(
    store: Store, database_url: str, field: str, changed: dict[str, Any]
) -> None:
    await create(store, "p1", scopes=("s1", "s2"))
    await create(store, "p2", scopes=("s1", "s2"))
    original = NewRun(id="r1", flow="f", payload={"n": 1}, scopes=("s1", "s2"), parent_id="p1")
    assert isinstance(await store.admission.create(original), Created)
    before = await counts(database_url)
    row_before = await must_get(store, "r1")

    with pytest.raises(ExecutionIdentityConflict) as caught:
        await store.admission.create(replace(original, **changed))

    assert caught.value.field == field
    assert caught.value.run_id == "r1"
    assert await counts(database_url) == before
    assert replace(await must_get(store, "r1"), now_ms=0) == replace(row_before, now_ms=0)


async def test_conflict_names_the_first_differing_field(store: Store) -> None:
    await create(store, "r1", flow="f", payload=1)
    with pytest.raises(ExecutionIdentityConflict) as caught:
        await store.admission.create(NewRun(id="r1", flow="g", payload=2))
    assert caught.value.field == "flow"
    assert caught.value.attempted == "g"
    assert "'f'" not in str(caught.value) and not hasattr(caught.value, "existing")


async def test_conflict_on_missing_versus_present_parent(store: Store) -> None:
    await create(store, "p1")
    await create(store, "r1")
    with pytest.raises(ExecutionIdentityConflict) as caught:
        await store.admission.create(NewRun(id="r1", flow="tests.flow", parent_id="p1"))
    assert caught.value.field == "parent"
    assert await store.dag.parents("r1") == []


async def test_rolled_back_outer_transaction_leaves_neither_row_nor_record(
    store: Store, database_url: str
) -> None:
    before = await counts(database_url)
    with pytest.raises(Boom):
        async with store.transaction():
            await create(store, "r1")
            assert await store.runs.get("r1") is not None  # visible inside the transaction
            assert await journal_kinds(store, "r1") == ["created"]
            raise Boom
    assert await store.runs.get("r1") is None
    assert await store.journal.records("r1") == []
    assert await counts(database_url) == before


async def test_admissions_in_one_transaction_commit_together(
    store: Store, database_url: str
) -> None:
    async with store.transaction():
        await create(store, "r1")
        await create(store, "r2")
    assert await count(database_url, "runs") == 2
    assert await journal_kinds(store, "r1") == ["created"]
    assert await journal_kinds(store, "r2") == ["created"]


async def test_child_admission_records_the_edge_and_parent(store: Store) -> None:
    await create(store, "parent")
    child = await create(store, "child", parent_id="parent")
    assert child.state["parent"] == "parent"
    assert child.on_parent_exit is OnParentExit.CANCEL
    assert child.cancel_requested_at_ms is None
    assert [(e.child_id, e.parent_id) for e in await store.dag.parents("child")] == [
        ("child", "parent")
    ]
    assert await journal_kinds(store, "child") == ["created", "parent-recorded"]


async def test_child_of_a_missing_parent_is_refused_and_writes_nothing(
    store: Store, database_url: str
) -> None:
    before = await counts(database_url)
    with pytest.raises(InvalidInput) as caught:
        await store.admission.create(NewRun(id="child", flow="f", parent_id="ghost"))
    assert caught.value.field == "parent_id"
    assert await counts(database_url) == before


async def test_child_of_a_cancel_requested_parent_inherits_the_request(store: Store) -> None:
    await create(store, "parent")
    await store.lifecycle.request_cancel("parent")
    parent = await must_get(store, "parent")
    child = await create(store, "child", parent_id="parent")
    assert child.cancel_requested_at_ms is not None
    assert child.cancel_requested_at_ms >= (parent.cancel_requested_at_ms or 0)
    created = (await store.journal.records("child"))[0]
    assert created.kind == "created" and created.payload["inherited_cancel"] is True


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
async def test_child_of_a_settled_parent_inherits_cancellation(
    store: Store, status: RunStatus
) -> None:
    parent = await make_running(store, "parent")
    settled = await store.lifecycle.transition_owned("parent", OWNER_A, parent.epoch, status)
    assert isinstance(settled, Transitioned)
    child = await create(store, "child", parent_id="parent")
    assert child.cancel_requested_at_ms is not None
    assert await store.sweeps.pending_cancellations() != []


async def test_detached_child_of_a_cancelled_parent_does_not_inherit(store: Store) -> None:
    await create(store, "parent")
    await store.lifecycle.request_cancel("parent")
    child = await create(store, "child", parent_id="parent", on_parent_exit=OnParentExit.DETACH)
    assert child.cancel_requested_at_ms is None
    assert child.on_parent_exit is OnParentExit.DETACH


async def test_child_may_narrow_but_not_widen_its_parents_scopes(
    store: Store, database_url: str
) -> None:
    await create(store, "parent", scopes=("a", "b"))
    narrowed = await create(store, "narrow", parent_id="parent", scopes=("a",))
    assert narrowed.scopes == ("a",)
    before = await counts(database_url)
    with pytest.raises(InvalidInput) as caught:
        await store.admission.create(
            NewRun(id="wide", flow="f", parent_id="parent", scopes=("a", "c"))
        )
    assert caught.value.field == "scopes"
    assert await counts(database_url) == before
    assert await store.runs.get("wide") is None


async def test_get_unknown_run_is_none(store: Store) -> None:
    assert await store.runs.get("nope") is None


async def test_get_reports_database_time(store: Store) -> None:
    row = await create(store, "r1")
    again = await must_get(store, "r1")
    assert again.now_ms >= row.created_at_ms


async def test_latest_round_follows_the_lineage(store: Store) -> None:
    await create(store, "r0", lineage_id="lin")
    await create(store, "r1", lineage_id="lin", round_ordinal=1, previous_round_id="r0")
    await create(store, "r2", lineage_id="lin", round_ordinal=2, previous_round_id="r1")
    await create(store, "solo")
    latest = await store.runs.latest_round("lin")
    assert latest is not None and latest.id == "r2" and latest.parent_run_id == "r1"
    solo = await store.runs.latest_round("solo")
    assert solo is not None and solo.id == "solo"
    assert await store.runs.latest_round("unknown") is None


async def test_delayed_admission_waits_on_a_timer(store: Store) -> None:
    row = await create(store, "r1", delay_until_ms=123_456)
    assert row.status is RunStatus.PENDING
    assert row.waiting is not None and row.waiting.reason == "timer"
    assert row.waiting.wake_at_ms == 123_456


async def test_concurrent_identical_admissions_create_once(
    settings: Settings, store: Store, database_url: str
) -> None:
    async with extra_stores(settings, 6) as stores:
        for i in range(20):
            run_id = f"r{i}"
            new = NewRun(id=run_id, flow="f", payload={"i": i})
            outcomes = await race([partial(s.admission.create, new) for s in stores])
            assert sum(isinstance(o, Created) for o in outcomes) == 1, outcomes
            assert sum(isinstance(o, Joined) for o in outcomes) == len(stores) - 1
            assert await journal_kinds(store, run_id) == ["created"]
    assert await count(database_url, "runs") == 20


async def test_another_id_for_a_taken_lineage_round_is_refused(
    store: Store, database_url: str
) -> None:
    await create(store, "r0", lineage_id="lin")
    before = await counts(database_url)
    with pytest.raises(InvalidInput) as caught:
        await store.admission.create(NewRun(id="imposter", flow="f", lineage_id="lin"))
    assert caught.value.field == "round_ordinal"
    assert await counts(database_url) == before
    assert await store.runs.get("imposter") is None


async def test_timeout_sets_a_deadline_on_the_database_clock(store: Store) -> None:
    before = await db_now(store)
    row = await create(store, "r1", timeout_ms=5_000)
    deadline = row.state["deadline_ms"]
    assert before + 5_000 <= deadline <= row.now_ms + 5_000
    assert (await create(store, "r2", deadline_ms=42)).state["deadline_ms"] == 42


async def test_given_a_deadline_and_a_timeout_the_earlier_wins(store: Store) -> None:
    now = await db_now(store)
    late = await create(store, "late", deadline_ms=now + 10**9, timeout_ms=5_000)
    assert late.deadline_ms is not None and late.deadline_ms <= late.now_ms + 5_000
    early = await create(store, "early", deadline_ms=now + 50, timeout_ms=5_000)
    assert early.deadline_ms == now + 50


async def test_an_attached_childs_deadline_is_bounded_by_its_parents(store: Store) -> None:
    """min(own timeout from its admission, the parent's deadline); a detached child keeps
    its own, and a child of a parent without a deadline has only its own."""
    parent = await create(store, "parent", timeout_ms=2_000)
    assert parent.deadline_ms is not None
    short = await create(store, "short", parent_id="parent", timeout_ms=100)
    assert short.deadline_ms is not None and short.deadline_ms <= short.now_ms + 100
    long = await create(store, "long", parent_id="parent", timeout_ms=60_000)
    assert long.deadline_ms == parent.deadline_ms, "never outlives the parent's deadline"
    untimed = await create(store, "untimed", parent_id="parent")
    assert untimed.deadline_ms == parent.deadline_ms
    spawned = await create(
        store, "spawned", parent_id="parent", on_parent_exit=OnParentExit.DETACH, timeout_ms=60_000
    )
    assert spawned.deadline_ms is not None and spawned.deadline_ms > parent.deadline_ms + 50_000
    free = await create(store, "free", parent_id="parent", on_parent_exit=OnParentExit.DETACH)
    assert free.deadline_ms is None
    await create(store, "open")
    own = await create(store, "own", parent_id="open", timeout_ms=100)
    assert own.deadline_ms is not None and own.deadline_ms <= own.now_ms + 100


async def test_get_many_reads_the_runs_that_exist(store: Store) -> None:
    await create(store, "a")
    await create(store, "b")
    rows = await store.runs.get_many(["b", "ghost", "a"])
    assert sorted(r.id for r in rows) == ["a", "b"]
    assert await store.runs.get_many([]) == []


async def test_get_for_update_holds_the_row_until_the_transaction_ends(
    settings: Settings, store: Store
) -> None:
    await create(store, "r1")
    assert (await must_get(store, "r1")).id == "r1"
    async with extra_stores(settings, 1) as (other,):
        async with store.transaction():
            locked = await store.runs.get_for_update("r1")
            assert locked is not None and locked.id == "r1"
            cancel = asyncio.ensure_future(other.lifecycle.request_cancel("r1"))
            await until(
                partial(lock_waiters, settings.database_url),
                10.0,
                "the cancel to wait for the row lock",
                accept=lambda n: n >= 1 or cancel.done(),
                every=0.002,
            )
            assert not cancel.done(), "a locked row was written by another transaction"
        assert isinstance(await cancel, CancelRequested)
    assert await store.runs.get_for_update("ghost") is None


async def test_admit_each_gives_every_run_its_own_outcome(store: Store, database_url: str) -> None:
    """A group commit's batch: a conflict or an invalid run is that run's error alone."""
    await create(store, "taken", flow="f", payload={"n": 1})
    outcomes = await store.admission.admit_each(
        [
            NewRun(id="a", flow="f"),
            NewRun(id="taken", flow="f", payload={"n": 2}),  # another identity
            NewRun(id="c", flow="f", max_rounds=0),  # refused before any write
            NewRun(id="taken", flow="f", payload={"n": 1}),  # the same run: joins
            NewRun(id="a", flow="f"),  # earlier in this batch: joins it
            NewRun(id="b", flow="f", payload={"big": "x" * 100}),
        ]
    )
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == [
        "Created",
        "ExecutionIdentityConflict",
        "InvalidInput",
        "Joined",
        "Joined",
        "Created",
    ], outcomes
    for run_id in ("a", "b", "taken"):
        assert await journal_kinds(store, run_id) == ["created"]
    assert await count(database_url, "runs") == 3


async def test_a_batch_past_the_text_cap_goes_as_several_pipelines(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runfleet.store import admit

    monkeypatch.setattr(admit, "BATCH_TEXT", 50)
    news = [NewRun(id=f"r{i}", flow="f", payload={"text": "y" * 40}) for i in range(5)]
    news.append(NewRun(id="r0", flow="f", payload={"text": "y" * 40}))
    outcomes = await store.admission.create_many(news)
    assert [type(o).__name__ for o in outcomes] == ["Created"] * 5 + ["Joined"]
    for new in news[:5]:
        assert await journal_kinds(store, new.id) == ["created"]
    with pytest.raises(ExecutionIdentityConflict):  # all or nothing, across pipelines too
        await store.admission.create_many(
            [NewRun(id=f"s{i}", flow="f", payload={"text": "z" * 40}) for i in range(3)]
            + [NewRun(id="r1", flow="other")]
        )
    assert await store.runs.get("s0") is None
