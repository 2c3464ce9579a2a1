"""``Lifecycle`` at its edges (real Postgres): the typed refusals of bad input, the exact
records a settlement, a cascade, a cancel request and its acknowledgement write, and what a
settled child hands its parents. Written against surviving ``make mutate`` mutants.
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from runfleet.store import Kind, Store, values
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import digest
from runfleet.store.types import (
    AlreadyRequested,
    CancelRequested,
    GuardFailed,
    NewRun,
    NotFound,
    NotOwner,
    RunStatus,
    Settle,
    Transitioned,
    Waiting,
    WaitingReason,
)
from runfleet.store.values import UnstorableValue
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    create,
    extra_stores,
    make_running,
    must_get,
    row_lock_gate,
)
from tests.support.polling import until


async def payloads(store: Store, run_id: str, kind: str) -> list[dict[str, object]]:
    return [dict(r.payload) for r in await store.journal.records(run_id) if r.kind == kind]


async def test_bad_transitions_are_refused_naming_the_field_and_why(store: Store) -> None:
    row = await make_running(store, "r")
    for status in (RunStatus.RUNNING, RunStatus.PENDING):
        with pytest.raises(InvalidInput) as caught:
            await store.lifecycle.transition_owned("r", OWNER_A, row.epoch, status)
        assert (caught.value.field, caught.value.problem) == (
            "to_status",
            f"an owned run cannot transition to {status}",
        )
    for status, waiting in (
        (RunStatus.SUSPENDED, None),
        (RunStatus.COMPLETED, Waiting(WaitingReason.EVENT)),
    ):
        with pytest.raises(InvalidInput) as caught:
            await store.lifecycle.transition_owned("r", OWNER_A, row.epoch, status, waiting=waiting)
        assert (caught.value.field, caught.value.problem) == (
            "waiting",
            "a suspended run needs a waiting reason, others none",
        )
    assert (await must_get(store, "r")).status is RunStatus.RUNNING


async def test_a_batch_settles_each_run_once_and_only_terminally(store: Store) -> None:
    assert await store.lifecycle.settle_many(OWNER_A, []) == []
    row = await make_running(store, "r")
    twice = [Settle("r", row.epoch, RunStatus.COMPLETED, {})] * 2
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.settle_many(OWNER_A, twice)
    assert (caught.value.field, caught.value.problem) == ("items", "a batch settles each run once")
    parked = [Settle("r", row.epoch, RunStatus.SUSPENDED, {})]
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.settle_many(OWNER_A, parked)
    assert (caught.value.field, caught.value.problem) == (
        "status",
        "settle_many settles runs, not suspended",
    )
    assert (await must_get(store, "r")).status is RunStatus.RUNNING


async def test_a_batch_answers_guard_failed_not_owner_and_not_found_per_item(
    store: Store,
) -> None:
    cancelled = await make_running(store, "cancelled")
    await store.lifecycle.request_cancel("cancelled")
    theirs = await make_running(store, "theirs", OWNER_B)
    items = [
        Settle("cancelled", cancelled.epoch, RunStatus.COMPLETED, {}),
        Settle("theirs", theirs.epoch, RunStatus.COMPLETED, {}),
        Settle("absent", 1, RunStatus.COMPLETED, {}),
    ]
    guard, other, absent = await store.lifecycle.settle_many(OWNER_A, items)
    assert isinstance(guard, GuardFailed) and guard.current.id == "cancelled"
    assert isinstance(other, NotOwner) and other.current.owner == OWNER_B
    assert isinstance(absent, NotFound)


async def test_a_settlement_record_says_where_the_run_went_at_which_epoch(store: Store) -> None:
    row = await make_running(store, "r")
    outcome = await store.lifecycle.transition_owned(
        "r", OWNER_A, row.epoch, RunStatus.FAILED, record=jr.Transitioned(epoch=row.epoch + 9)
    )
    assert isinstance(outcome, Transitioned) and outcome.cascaded == () and outcome.woke == ()
    (record,) = await payloads(store, "r", Kind.TRANSITIONED)
    assert record == {"to": "failed", "epoch": row.epoch}, "the transition's own, stamped"


async def test_a_cascade_asks_each_child_by_name_and_tells_the_parent_whom(
    store: Store,
) -> None:
    parent = await make_running(store, "p")
    for child in ("c2", "c1"):
        await create(store, child, parent_id="p")
    outcome = await store.lifecycle.transition_owned(
        "p", OWNER_A, parent.epoch, RunStatus.COMPLETED, state_patch={"result": 1}
    )
    assert isinstance(outcome, Transitioned) and sorted(outcome.cascaded) == ["c1", "c2"]
    for child in ("c1", "c2"):
        (asked,) = await payloads(store, child, Kind.CANCEL_REQUESTED)
        assert asked == {"actor": "postgres", "cause": "parent-completed", "by": "p"}
    (policy,) = await payloads(store, "p", Kind.CHILD_POLICY_APPLIED)
    assert policy["cause"] == "parent-completed"
    cascaded_to = policy["cascaded_to"]
    assert isinstance(cascaded_to, list) and sorted(cascaded_to) == ["c1", "c2"]
    first = [r for r in await store.journal.records("c1") if r.kind == Kind.CANCEL_REQUESTED]
    second = [r for r in await store.journal.records("c2") if r.kind == Kind.CANCEL_REQUESTED]
    assert first[0].seq < second[0].seq, "children are asked in id order"


async def test_a_cancel_request_is_journaled_with_who_asked_why_and_from_which_status(
    store: Store,
) -> None:
    await create(store, "r")
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.request_cancel("r", note="bad\x00note")
    assert caught.value.field == "actor"
    with pytest.raises(InvalidInput) as bad_id:
        await store.lifecycle.request_cancel("")
    assert bad_id.value.field == "run_id"
    asked = await store.lifecycle.request_cancel("r", note="ops-alice", reason="deadline")
    assert isinstance(asked, CancelRequested) and asked.row.id == "r"
    assert asked.rounds == ("r",) and asked.cascaded == ()
    (record,) = await payloads(store, "r", Kind.CANCEL_REQUESTED)
    assert record == {
        "actor": "postgres",
        "note": "ops-alice",
        "reason": "deadline",
        "status": "pending",
    }
    again = await store.lifecycle.request_cancel("r")
    assert isinstance(again, AlreadyRequested) and again.row.id == "r"


async def test_a_cancel_reaches_the_parents_children_with_the_parent_cancelled_cause(
    store: Store,
) -> None:
    await make_running(store, "p")
    await create(store, "kid", parent_id="p")
    asked = await store.lifecycle.request_cancel("p")
    assert isinstance(asked, CancelRequested) and asked.cascaded == ("kid",)
    (kid,) = await payloads(store, "kid", Kind.CANCEL_REQUESTED)
    assert kid["cause"] == "parent-cancelled" and kid["by"] == "p"


async def test_an_acknowledged_cancel_records_who_closed_it(store: Store) -> None:
    row = await make_running(store, "r")
    await store.lifecycle.request_cancel("r")
    outcome = await store.lifecycle.acknowledge_cancel("r", OWNER_A, row.epoch, found_at="lapse")
    assert isinstance(outcome, Transitioned)
    closed = await must_get(store, "r")
    assert closed.status is RunStatus.CANCELLED
    assert closed.state["cancellation"] == {
        "acknowledged_by": OWNER_A.key,
        "found_at_release": "lapse",
    }
    (record,) = await payloads(store, "r", Kind.INTERRUPTED)
    assert record == {
        "to": "cancelled",
        "epoch": row.epoch,
        "cancelled": True,
        "found_at_release": "lapse",
    }
    plain = await make_running(store, "q")
    await store.lifecycle.acknowledge_cancel("q", OWNER_A, plain.epoch)
    assert (await must_get(store, "q")).state["cancellation"] == {"acknowledged_by": OWNER_A.key}


async def test_a_settled_child_hands_its_error_and_handoff_to_its_parent(store: Store) -> None:
    await make_running(store, "p")
    await make_running(store, "kid", OWNER_B, parent_id="p")
    error = {"type": "Boom", "message": "no"}
    await store.lifecycle.transition_owned(
        "kid", OWNER_B, 1, RunStatus.FAILED, state_patch={"error": error}
    )
    deferred = await store.deferreds.deferred("p", "child:kid")
    assert deferred is not None
    assert deferred.value == {
        "status": "failed",
        "result": None,
        "error": error,
        "handed_off_to": None,
    }


async def test_a_handoff_records_its_successor_and_keeps_the_rounds_children(
    store: Store,
) -> None:
    row = await make_running(store, "L", flow="sr.lineage")
    await create(store, "kid", parent_id="L")
    successor = NewRun(id="L@1", flow="sr.lineage", lineage_id="L", round_ordinal=1)
    done = await store.lifecycle.hand_off("L", OWNER_A, row.epoch, successor)
    assert isinstance(done.outcome, Transitioned) and done.successor is not None
    assert done.successor.id == "L@1" and done.successor.status is RunStatus.PENDING
    settled = await must_get(store, "L")
    assert settled.status is RunStatus.COMPLETED and settled.handed_off_to == "L@1"
    (record,) = await payloads(store, "L", Kind.HANDED_OFF)
    assert record == {"to": "completed", "epoch": row.epoch, "successor": "L@1", "round": 1}
    kid = await must_get(store, "kid")
    assert kid.cancel_requested_at_ms is None, "the lineage carries on: its children too"
    assert await payloads(store, "L", Kind.CHILD_POLICY_APPLIED) == []


async def test_a_handoff_by_a_process_that_lost_the_run_admits_nothing(store: Store) -> None:
    row = await make_running(store, "L", flow="sr.lineage")
    successor = NewRun(id="L@1", flow="sr.lineage", lineage_id="L", round_ordinal=1)
    done = await store.lifecycle.hand_off("L", OWNER_B, row.epoch, successor)
    assert isinstance(done.outcome, NotOwner) and done.outcome.current.owner == OWNER_A
    assert done.successor is None
    assert await store.runs.get("L@1") is None


def test_the_per_item_check_refuses_an_unstorable_patch(store: Store) -> None:
    item = Settle("r", 1, RunStatus.FAILED, {"error": "\x00"})
    with pytest.raises(UnstorableValue):
        store.lifecycle.check(item)
    store.lifecycle.check(Settle("r", 1, RunStatus.FAILED, {"error": "ok"}))


async def test_a_status_that_is_not_one_is_refused_by_name(store: Store) -> None:
    row = await make_running(store, "r")
    bogus = Settle("r", row.epoch, "bogus", {})  # type: ignore[arg-type]  # a status that is not one, on purpose
    with pytest.raises(InvalidInput) as caught:
        await store.lifecycle.settle_many(OWNER_A, [bogus])
    assert caught.value.field == "status"
    with pytest.raises(InvalidInput) as single:
        await store.lifecycle.transition_owned("r", OWNER_A, row.epoch, "bogus")  # type: ignore[arg-type]  # a status that is not one, on purpose
    assert single.value.field == "to_status"


async def test_settlement_records_carry_the_digest_of_their_payload(store: Store) -> None:
    """One by one or batched: the stored digest is the payload's (an audit can verify it)."""
    one = await make_running(store, "one")
    await store.lifecycle.transition_owned("one", OWNER_A, one.epoch, RunStatus.COMPLETED)
    many = await make_running(store, "many")
    await store.lifecycle.settle_many(OWNER_A, [Settle("many", many.epoch, RunStatus.FAILED, {})])
    async with await psycopg.AsyncConnection.connect(store.settings.database_url) as conn:
        cursor = await conn.execute(
            "SELECT run_id, payload, digest FROM runfleet.journal WHERE kind = %s ORDER BY seq",
            (Kind.TRANSITIONED,),
        )
        rows = await cursor.fetchall()
    assert [r[0] for r in rows] == ["one", "many"]
    for _run_id, payload, stored in rows:
        assert stored == digest(payload)


async def test_a_batch_settlement_cascades_with_its_own_status_as_the_cause(
    store: Store,
) -> None:
    parent = await make_running(store, "p")
    await create(store, "kid", parent_id="p")
    (outcome,) = await store.lifecycle.settle_many(
        OWNER_A, [Settle("p", parent.epoch, RunStatus.FAILED, {})]
    )
    assert isinstance(outcome, Transitioned) and outcome.cascaded == ("kid",)
    (asked,) = await payloads(store, "kid", Kind.CANCEL_REQUESTED)
    assert asked == {"actor": "postgres", "cause": "parent-failed", "by": "p"}
    (policy,) = await payloads(store, "p", Kind.CHILD_POLICY_APPLIED)
    assert policy == {"cause": "parent-failed", "cascaded_to": ["kid"]}


async def test_a_round_admitted_while_the_cancel_waited_is_asked_in_the_same_request(
    settings: Settings, store: Store
) -> None:
    """The cancel's UPDATE waits on the live round's lock; a round admitted into the lineage
    meanwhile is invisible to it. The fresh read finds that round and the same request asks
    it too: both rounds are answered and journaled, and the newest round is the target."""
    await create(store, "L")
    async with extra_stores(settings, 1) as (producer,):
        async with row_lock_gate(settings.database_url, "L") as gate:
            asking = asyncio.ensure_future(producer.lifecycle.request_cancel("L", note="ops"))
            await until(
                gate.waiters, 10.0, "the cancel to queue", accept=lambda n: n >= 1, every=0.002
            )
            await create(store, "L@1", lineage_id="L", round_ordinal=1)
        outcome = await asking
    assert isinstance(outcome, CancelRequested), outcome
    assert outcome.rounds == ("L", "L@1"), "the round it waited on, then the one it found"
    assert outcome.row.id == "L@1", "the target is the newest round asked"
    for round_id in ("L", "L@1"):
        assert (await must_get(store, round_id)).cancel_requested_at_ms is not None
    (first,) = await payloads(store, "L", Kind.CANCEL_REQUESTED)
    (found,) = await payloads(store, "L@1", Kind.CANCEL_REQUESTED)
    assert first == {"actor": "postgres", "note": "ops", "reason": None, "status": "pending"}
    assert found == {**first, "via": "L"}


async def test_a_result_is_its_own_column_and_an_unstorable_one_is_named_by_its_path(
    store: Store,
) -> None:
    row = await make_running(store, "r")
    with pytest.raises(UnstorableValue) as caught:
        await store.lifecycle.transition_owned(
            "r", OWNER_A, row.epoch, RunStatus.COMPLETED, state_patch={"result": ["a", "\x00"]}
        )
    assert caught.value.field == "state" and caught.value.problem.startswith('$["result"][1]')
    with pytest.raises(UnstorableValue) as other:
        await store.lifecycle.transition_owned(
            "r", OWNER_A, row.epoch, RunStatus.COMPLETED, state_patch={"note": "nul\x00"}
        )
    assert other.value.field == "state" and other.value.problem.startswith('$["note"]')
    assert (await must_get(store, "r")).status is RunStatus.RUNNING, "nothing written"
    done = await store.lifecycle.transition_owned(
        "r", OWNER_A, row.epoch, RunStatus.COMPLETED, state_patch={"result": [1e16, 2], "n": 1}
    )
    assert isinstance(done, Transitioned)
    settled = await must_get(store, "r")
    assert settled.result == [1e16, 2] and isinstance(settled.result[0], float)
    assert settled.state["n"] == 1


async def test_data_postgres_refuses_at_a_settlement_is_unstorable_state_and_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What slips past the check (here: the check itself switched off, the encoder a bare
    ``json.dumps``; the batch sends the text the check encoded) and Postgres refuses (a NUL
    in jsonb, SQLSTATE 22P05) is UnstorableValue of ``state``, not a retry."""
    row = await make_running(store, "r")
    monkeypatch.setattr(values, "encode_canonical", lambda value, *_args: json.dumps(value))
    bad = {"note": "nul\x00"}
    item = Settle("r", row.epoch, RunStatus.COMPLETED, bad)
    for settle in (
        lambda: store.lifecycle.transition_owned(
            "r", OWNER_A, row.epoch, RunStatus.COMPLETED, state_patch=bad
        ),
        lambda: store.lifecycle.settle_many(OWNER_A, [item]),
    ):
        with pytest.raises(UnstorableValue) as caught:
            await settle()
        assert caught.value.field == "state"
        assert caught.value.problem.startswith("Postgres refused it: ")
        assert isinstance(caught.value.__cause__, psycopg.DataError)
    assert (await must_get(store, "r")).status is RunStatus.RUNNING
