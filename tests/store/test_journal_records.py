"""The journal's words as types (store/journal_records.py).

Every kind has a payload type; each one survives write → Postgres → read → decode and
reads as its sentence in ``explain``; the real writers store exactly what their type
dumps (no field the type does not know, none it would write differently); and a record
of an older, newer or hostile writer still decodes and renders.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runfleet.ops.explain.journal_text import probe_words, render, sentence
from runfleet.store import Store, settlements
from runfleet.store import journal_records as jr
from runfleet.store.forks import Forks
from runfleet.store.journal_records import PAYLOADS, CascadeCause, Kind, decode
from runfleet.store.steps import StepWrite
from runfleet.store.types import (
    JournalRecord,
    NewRun,
    Reconfirmation,
    RunError,
    RunStatus,
    Settle,
    Stolen,
    Waiting,
    WaitingReason,
)
from tests.store.helpers import (
    OWNER_A,
    OWNER_B,
    create,
    make_running,
    must_get,
    wait_db_time_past,
)

A = OWNER_A.key
B = OWNER_B.key
DETAIL = {"key": "absent", "redis": "ok"}

SAMPLES: dict[Kind, tuple[jr.Payload, str]] = {
    Kind.CREATED: (
        jr.Created(flow="f.x", queue="q", inherited_cancel=True),
        "created as f.x on queue q, cancelled at admission because its parent was already "
        "cancelled or settled",
    ),
    Kind.PARENT_RECORDED: (jr.ParentRecorded(parent="p1"), "recorded as a child of p1"),
    Kind.CLAIMED_AND_ACTIVATED: (
        jr.ClaimedAndActivated(owner=A, epoch=3, from_status="pending", ahead_of="r0"),
        "claimed and started by host-a pid 101 (epoch 3, was pending)",
    ),
    Kind.CLAIMED: (jr.Claimed(claimant=A), "claimed by host-a pid 101"),
    Kind.ACTIVATED: (jr.Activated(owner=A, epoch=2), "started by host-a pid 101 (epoch 2)"),
    Kind.STOLEN_AND_ACTIVATED: (
        jr.StolenAndActivated(
            owner=B,
            epoch=4,
            previous_owner=A,
            previous_heartbeat_at_ms=1_000,
            lease_age_ms=9_000,
            probe="cross-host-unreachable-stale",
            observer=B,
            probe_detail=DETAIL,
        ),
        "stolen from host-a pid 101 by host-b pid 202: lease stale 9.0 s and its liveness "
        "key is absent [cross-host-unreachable-stale] (epoch 4)",
    ),
    Kind.CLAIM_RECOVERED: (
        jr.ClaimRecovered(claimant=A, probe="same-host-pid-dead", probe_detail=DETAIL),
        "stranded claim of host-a pid 101 cleared: its pid is gone on the same host",
    ),
    Kind.CLAIM_ABANDONED: (jr.ClaimAbandoned(claimant=A), "claim abandoned by host-a pid 101"),
    Kind.CLAIM_LOST: (
        jr.ClaimLost(observer=B, status="running"),
        "host-b pid 202 lost a claim race (the run was running by then)",
    ),
    Kind.ACTIVATION_LOST: (
        jr.ActivationLost(observer=B, outcome=jr.LostOutcome.SNAPSHOT_CHANGED, expected_epoch=2),
        "host-b pid 202 lost the race to take it over",
    ),
    Kind.STEAL_REFUSED_OWNER_ALIVE: (
        jr.StealRefusedOwnerAlive(
            evidence=jr.RefusalEvidence.PROBE,
            observer=B,
            heartbeat_at_ms=None,  # a record of an older version: its age instead
            probe="same-host-pid-alive",
            lease_age_ms=7_000,
        ),
        "takeover by host-b pid 202 refused: lease stale 7.0 s but the owner is alive "
        "(its pid is running on the same host); re-probed on a backoff ladder",
    ),
    Kind.RESUMED: (
        jr.Resumed(
            from_state=jr.ResumedFrom.DEAD,
            actor="ops",
            note="alice",
            accept_recorded=True,
            rerun_step="s1",
            recoveries=3,
            evidence={"probe": "x"},
        ),
        "moved on from dead by ops (alice): its 3 recoveries in a row were forgotten and "
        "its body re-runs from its last recorded step",
    ),
    Kind.TRANSITIONED: (
        jr.Transitioned(to=RunStatus.COMPLETED, epoch=1),
        "settled completed (epoch 1)",
    ),
    Kind.PARKED: (
        jr.Parked(reason="approval", wake_at_ms=None, token="t" * 40, deferred="d", epoch=1),
        f"parked waiting for approval 'd' (token {'t' * 8}…) (epoch 1)",
    ),
    Kind.WOKEN: (
        jr.Woken(reason="timer", cause=jr.WakeCause.DRIVER_TIMER),
        "woken from its timer wait (by driver:timer)",
    ),
    Kind.INTERRUPT_RELEASED: (
        jr.InterruptReleased(
            cause=jr.ReleaseCause.LEASE_LAPSED,
            detail="lease-lapsed",
            owner=A,
            epoch=2,
            unconfirmed_ms=5_000,
        ),
        "released by host-a pid 101 (its lease lapsed) so another worker resumes it (epoch 2)",
    ),
    Kind.CANCEL_REQUESTED: (
        jr.CancelRequested(
            actor="ops",
            note="alice",
            reason="why",
            status="running",
            via="r@1",
            cause=CascadeCause.PARENT_FAILED,
            by="p1",
            inherited_from="p0",
        ),
        "cancellation asked because p1 ended (parent-failed)",
    ),
    Kind.INTERRUPTED: (
        jr.Interrupted(
            to=RunStatus.CANCELLED,
            epoch=2,
            cancelled=True,
            found_at_release="shutdown",
            by="r1",
            cause="parent-cancelled",
        ),
        "cancelled by its owner (epoch 2)",
    ),
    Kind.HANDED_OFF: (
        jr.HandedOff(to=RunStatus.COMPLETED, epoch=1, successor="r@2", round=2),
        "completed this round and handed off to r@2 (round 2)",
    ),
    Kind.LINEAGE_EXHAUSTED: (
        jr.LineageExhausted(to=RunStatus.FAILED, epoch=1, max_rounds=3),
        "failed: its lineage reached max_rounds=3",
    ),
    Kind.ROUND_INVALID: (
        jr.RoundInvalid(to=RunStatus.FAILED, epoch=1, successor="r@2"),
        "failed: its next round 'r@2' could not be admitted",
    ),
    Kind.WAKE_SCHEDULED: (jr.WakeScheduled(), "wake-scheduled (no details)"),
    Kind.CHILD_POLICY_APPLIED: (
        jr.ChildPolicyApplied(cause=CascadeCause.PARENT_CANCELLED, cascaded_to=["c1", "c2"]),
        "parent-cancelled: 2 attached descendant run(s) asked to cancel (each closes through "
        "its own cancel path)",
    ),
    Kind.QUARANTINED: (
        jr.Quarantined(key="s1", problem="bad digest"),
        "quarantined: key=s1, problem=bad digest",
    ),
    Kind.DEAD_LETTERED: (
        jr.DeadLettered(
            probe="cross-host-unreachable-stale",
            probe_detail=DETAIL,
            max_recoveries=2,
            lost_owners=[A, B],
            last_owner=A,
            recoveries=2,
            observer=B,
            previous_owner=A,
            previous_heartbeat_at_ms=1_000,
            epoch=3,
        ),
        "parked dead by host-b pid 202 instead of a takeover: the lease of host-a pid 101 "
        "went stale again after 2 takeover(s) in a row (max 2); processes lost, newest "
        "first: host-a pid 101, host-b pid 202",
    ),
    Kind.LEASE_RECONFIRMED: (
        jr.LeaseReconfirmed(owner=A, epoch=1, confirmed_ms=5, unconfirmed_ms=6),
        f"lease reconfirmed (epoch=1, owner={A}, confirmed_ms=5, unconfirmed_ms=6)",  # jsonb order
    ),
    Kind.DEFERRED_COMPLETED: (
        jr.DeferredCompleted(
            name="d", woke=True, digest="ab", answered_by="ops", note="n", timed_out=True
        ),
        "wait 'd' timed out",
    ),
    Kind.CLOCK_FIRED: (jr.ClockFired(clock="c1"), "timer 'c1' fired"),
    Kind.STEP_RECORDED: (
        jr.StepRecorded(key="k", kind="step", position=0, epoch=1),
        "recorded step 'k' at position 0 (epoch 1)",
    ),
    Kind.STEP_COMPENSATED: (jr.StepCompensated(key="k"), "compensated step 'k'"),
    Kind.STEP_COMPENSATION_FAILED: (
        jr.StepCompensationFailed(key="k", error="boom"),
        "compensation of step 'k' failed: boom",
    ),
    Kind.APPROVAL_APPROVED: (
        jr.ApprovalApproved(token="h" * 40, actor="ops", note="n", reason="ok"),
        f"approved by ops (note: n) (token {'h' * 8}…): ok",
    ),
    Kind.APPROVAL_DENIED: (
        jr.ApprovalDenied(token="h" * 40, actor="ops", note="n", reason="no"),
        f"denied by ops (note: n) (token {'h' * 8}…): no",
    ),
    Kind.EVENT_SET: (
        jr.EventSet(key="e", version=2, digest="0123456789"),
        "set event 'e' (value 2, digest 01234567)",
    ),
    Kind.MESSAGE_SENT: (
        jr.MessageSent(topic="t", seq=1, digest="d", woke=True, message_id="m"),
        "message 1 sent on 't' and it woke the run",
    ),
    Kind.MESSAGE_RECEIVED: (
        jr.MessageReceived(topic="t", seq=1, key="k"),
        "message 1 on 't' received by 'k'",
    ),
    Kind.FORKED: (
        jr.Forked(to="r2", calls=3, actor="ops", note="n"),
        "forked into r2, which replays its first 3 recorded call(s) by ops (n)",
    ),
    Kind.RESUMED_AS: (
        jr.ResumedAs(to="r2", calls=3, actor="ops", note="n"),
        "resumed as r2, which replays its first 3 recorded call(s) by ops (n)",
    ),
    Kind.FORKED_FROM: (
        jr.ForkedFrom(from_run="r1", calls=3, kind="resumed-as", actor="ops", note="n"),
        "resumes r1: its first 3 recorded call(s) are replayed, not run again by ops (n)",
    ),
}


def _record(kind: str, payload: object, *, run_id: str = "r1", at_ms: int = 5_000) -> JournalRecord:
    return JournalRecord(
        seq=1, run_id=run_id, kind=kind, source_id="s", source_seq=1, payload=payload, at_ms=at_ms
    )


def test_every_kind_has_a_payload_type_and_a_sample() -> None:
    assert set(PAYLOADS) == set(Kind)
    assert all(cls.KIND is kind for kind, cls in PAYLOADS.items())
    assert set(SAMPLES) == set(Kind)


_UNSET = {(Kind.PARKED, "wake_at_ms"), (Kind.STEAL_REFUSED_OWNER_ALIVE, "heartbeat_at_ms")}
"""Fields whose sentence would depend on the wall clock; each is covered elsewhere."""


@pytest.mark.parametrize("kind", list(Kind))
def test_a_sample_sets_every_field(kind: Kind) -> None:
    """So the round trip below carries each field, not only the defaults."""
    payload, _ = SAMPLES[kind]
    assert type(payload) is PAYLOADS[kind]
    for f in dataclasses.fields(payload):
        if f.name != "extra" and (kind, f.name) not in _UNSET:
            value = getattr(payload, f.name)
            assert value is not None and value is not False and value != [], f.name


@pytest.mark.parametrize("kind", list(Kind))
async def test_each_kind_round_trips_through_the_journal_to_its_sentence(
    store: Store, kind: Kind
) -> None:
    payload, words = SAMPLES[kind]
    await create(store, "r1")
    await store.journal.record("r1", payload)
    stored = [r for r in await store.journal.records("r1") if r.kind == kind][-1]
    decoded = decode(stored.kind, stored.payload)
    assert decoded == payload
    assert isinstance(decoded, jr.Payload) and decoded.extra == {}
    assert decoded.dump() == payload.dump() == stored.payload
    assert sentence(stored) == words


# ---- what the writers store is what the types dump -------------------------------------


async def _drive_the_writers(store: Store) -> None:
    """One pass through the store's journal writers, each writing its own records."""
    parent = await make_running(store, "p1")
    await create(store, "c1", parent_id="p1")
    await create(store, "c2", parent_id="p1")
    # claimed, activated, abandoned, then the fast path
    c1 = await must_get(store, "c1")
    assert await store.runs.claim("c1", c1.snapshot, OWNER_B) is not None
    c1 = await must_get(store, "c1")
    assert c1.claimed_at_ms is not None
    await store.runs.activate("c1", OWNER_B, c1.claimed_at_ms)
    await store.steps.record(
        "c1", OWNER_B, 1, key="k0", name="step0", kind="step", position=0, output={"v": 1}
    )
    await store.steps.mark_compensated("c1", OWNER_B, 1, "k0")
    await store.events.set_event(
        OWNER_B, StepWrite("c1", 1, "k1", "set_event", "event", 1, None), "e", {"x": 1}
    )
    await store.runs.heartbeat(
        OWNER_B, ["c1"], reconfirm=Reconfirmation(epochs={"c1": 1}, unconfirmed_ms=5)
    )
    await store.waits.park("c1", OWNER_B, 1, Waiting(reason=WaitingReason.EVENT), deferred="d")
    await store.deferreds.complete_deferred("c1", "d", {"ok": True}, {"answered_by": "ops"})
    await make_running(store, "w1")
    await store.waits.park("w1", OWNER_A, 1, Waiting(reason=WaitingReason.EVENT), deferred="e")
    await store.waits.wake("w1")
    # a timer: parked, its clock fired
    timer = await make_running(store, "t1")
    await store.waits.schedule_clock("t1", "c", "d", 0, OWNER_A, timer.epoch)
    await store.waits.park("t1", OWNER_A, 1, Waiting(reason=WaitingReason.TIMER, wake_at_ms=0))
    await store.waits.complete_clock("t1", "c")
    # a release and a message
    await make_running(store, "m1")
    await store.events.send("m1", "topic", {"hi": 1}, message_id="mid")
    await store.waits.release(
        "m1",
        OWNER_A,
        1,
        cause=jr.ReleaseCause.LEASE_LAPSED,
        detail="lease-lapsed",
        unconfirmed_ms=7,
    )
    # the parent settles: its children are asked to cancel; one closes cancelled
    await store.lifecycle.settle_many(
        OWNER_A, [Settle("p1", parent.epoch, RunStatus.FAILED, {"error": {"type": "E"}})]
    )
    c2 = await must_get(store, "c2")
    await store.runs.claim_and_activate("c2", c2.snapshot, OWNER_A)
    await store.lifecycle.acknowledge_cancel("c2", OWNER_A, 1, found_at="x")
    # each ending's constructor (store.settlements), one settled alone, the rest a batch
    ends = {run_id: await make_running(store, run_id) for run_id in ("e1", "e2", "e3", "e4")}
    await store.lifecycle.settle(OWNER_A, settlements.completed("e1", ends["e1"].epoch, 1))
    await store.lifecycle.settle_many(
        OWNER_A,
        [
            settlements.failed("e2", ends["e2"].epoch, RunError(type="E")),
            settlements.lineage_exhausted("e3", ends["e3"].epoch, 2),
            settlements.round_invalid("e4", ends["e4"].epoch, RunError(type="X"), "e4@1"),
        ],
    )
    # a handoff: the round settles with its successor named
    round0 = await make_running(store, "h1")
    successor = NewRun(id="h1@1", flow="f", lineage_id="h1", round_ordinal=1)
    await store.lifecycle.hand_off("h1", OWNER_A, round0.epoch, successor)
    # a direct cancel request on a pending run
    await create(store, "x1")
    await store.lifecycle.request_cancel("x1", note="alice", reason="why")
    # a fork of c1's first recorded call
    await Forks(store).fork("c1", upto=1, new_id="f1", actor="alice")
    # a takeover with the evidence a worker journals, then a quarantine released
    stale = await make_running(store, "s1")
    assert stale.heartbeat_at_ms is not None
    await wait_db_time_past(store, stale.heartbeat_at_ms + 5)
    evidence = jr.ProbeEvidence(
        probe="cross-host-unreachable-stale", observer=B, probe_detail=DETAIL
    )
    taken = await store.runs.steal("s1", stale.snapshot, OWNER_B, evidence, stale_after_ms=1)
    assert isinstance(taken, Stolen), taken
    problem = jr.Quarantined(key="k", problem="recorded output does not match its digest")
    await store.waits.quarantine("s1", OWNER_B, taken.row.epoch, problem)
    assert await store.steps.resume_quarantined("s1", accept_recorded=True, note="alice")


async def test_the_writers_store_exactly_what_their_type_dumps(store: Store) -> None:
    await _drive_the_writers(store)
    seen: set[str] = set()
    written = ("p1", "c1", "c2", "w1", "t1", "m1", "x1", "f1", "s1", "e1", "e2", "e3", "e4", "h1")
    for run_id in written:
        for record in await store.journal.records(run_id):
            decoded = decode(record.kind, record.payload)
            assert isinstance(decoded, jr.Payload), record
            assert decoded.extra == {}, (record.kind, decoded.extra)
            assert decoded.dump() == record.payload, record.kind
            assert not sentence(record).startswith(f"{record.kind} ("), record
            seen.add(record.kind)
    expected = {
        Kind.CREATED, Kind.PARENT_RECORDED, Kind.CLAIMED_AND_ACTIVATED, Kind.CLAIMED,
        Kind.ACTIVATED, Kind.STEP_RECORDED, Kind.STEP_COMPENSATED, Kind.EVENT_SET,
        Kind.LEASE_RECONFIRMED, Kind.PARKED, Kind.DEFERRED_COMPLETED, Kind.WOKEN,
        Kind.CLOCK_FIRED, Kind.MESSAGE_SENT, Kind.INTERRUPT_RELEASED, Kind.TRANSITIONED,
        Kind.CHILD_POLICY_APPLIED, Kind.CANCEL_REQUESTED, Kind.INTERRUPTED, Kind.FORKED,
        Kind.FORKED_FROM, Kind.STOLEN_AND_ACTIVATED, Kind.QUARANTINED, Kind.RESUMED,
        Kind.LINEAGE_EXHAUSTED, Kind.ROUND_INVALID, Kind.HANDED_OFF,
    }  # fmt: skip
    assert expected <= seen, expected - seen
    # what the callers handed over is what was stored: the probe's evidence, the
    # deferred's caller metadata, the quarantine's problem
    (stolen,) = await payloads_of(store, "s1", Kind.STOLEN_AND_ACTIVATED)
    assert (stolen["probe"], stolen["observer"], stolen["probe_detail"]) == (
        "cross-host-unreachable-stale",
        B,
        DETAIL,
    )
    (answered,) = await payloads_of(store, "c1", Kind.DEFERRED_COMPLETED)
    assert answered["answered_by"] == "ops" and answered["name"] == "d"
    (quarantined,) = await payloads_of(store, "s1", Kind.QUARANTINED)
    assert quarantined == {"key": "k", "problem": "recorded output does not match its digest"}


async def payloads_of(store: Store, run_id: str, kind: Kind) -> list[Any]:
    return [r.payload for r in await store.journal.records(run_id) if r.kind == kind]


# ---- older, newer and hostile records ---------------------------------------------------


def test_an_unknown_kind_renders_its_name_and_fields() -> None:
    record = _record("made-up-by-v9", {"a": 1, "b": "two"})
    assert decode(record.kind, record.payload) == jr.UnknownPayload(
        "made-up-by-v9", {"a": 1, "b": "two"}
    )
    assert sentence(record) == "made-up-by-v9 (a=1, b=two)"


def test_an_older_record_missing_fields_renders_with_question_marks() -> None:
    assert sentence(_record(Kind.CREATED, {})) == "created as ? on queue ?"
    assert sentence(_record(Kind.CLAIMED_AND_ACTIVATED, {"owner": A})) == (
        "claimed and started by host-a pid 101"
    )
    old_refusal = {"evidence": "probe", "observer": B, "lease_age_ms": 3_000}  # no heartbeat
    assert "lease stale 3.0 s" in sentence(_record(Kind.STEAL_REFUSED_OWNER_ALIVE, old_refusal))


def test_a_newer_record_keeps_its_unknown_fields() -> None:
    decoded = decode(Kind.CLAIMED, {"claimant": A, "added_in_v9": [1]})
    assert decoded == jr.Claimed(claimant=A)
    assert isinstance(decoded, jr.Claimed) and decoded.extra == {"added_in_v9": [1]}
    assert sentence(_record(Kind.CLAIMED, {"claimant": A, "added_in_v9": [1]})) == (
        "claimed by host-a pid 101"
    )


def test_an_ill_typed_field_reads_as_absent() -> None:
    decoded = decode(Kind.TRANSITIONED, {"to": "sideways", "epoch": True})
    assert decoded == jr.Transitioned()
    assert sentence(_record(Kind.TRANSITIONED, {"to": 7, "epoch": "1"})) == "moved to ?"


HOSTILE: list[Any] = [
    None, True, 0, -1, 10**30, 1e308, float("nan"), "", "x" * 5000, "\x1b[2J", [], [None],
    [1, "a"], {}, {"key": "inconsistent", "confirmed_ms": "x"}, {"a": {"b": {"c": [1]}}},
]  # fmt: skip


@pytest.mark.parametrize("kind", [*Kind, "made-up"])
def test_a_hostile_payload_never_breaks_the_renderer(kind: str) -> None:
    """``render`` itself (not only ``sentence``'s last-resort fallback) takes any value in
    any field: the decode turned it into a typed value or an absence first."""
    cls = PAYLOADS[Kind(kind)] if kind in Kind._value2member_map_ else None
    names = [f.name for f in dataclasses.fields(cls)] if cls is not None else ["a"]
    keys = [cls.KEYS.get(n, n) for n in names if n != "extra"] if cls is not None else names
    for value in HOSTILE:
        for payload in ({k: value for k in keys}, value):
            record = _record(kind, payload)
            raw = payload if isinstance(payload, dict) else {"value": payload}
            text = render(decode(kind, payload), record, raw)
            assert isinstance(text, str) and text
            assert sentence(record) == text


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_probe_detail_still_reads_in_words(value: object) -> None:
    keys = [f.name for f in dataclasses.fields(jr.ProbeDetail) if f.name != "extra"]
    for case in ("inconsistent", "ttl-implausible", "malformed", "unverified", value):
        detail = {**{k: value for k in keys}, "key": case}
        for evidence in ("lease-expired", "same-host-pid-alive", value):
            assert isinstance(probe_words(evidence, detail), str)
