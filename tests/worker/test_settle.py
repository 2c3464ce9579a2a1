"""``Settlement`` ending by ending against the real store: what each writes, journals, counts,
announces and hints, and how it fails closed (an error that cannot be stored, a lost fence,
a compensation that fails). Runs are activated under ``OWNER_A`` through the store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

import runfleet.worker.settle as settle_module
from runfleet.store import Kind, Store, settlements
from runfleet.store.config import Settings
from runfleet.store.journal_records import ReleaseCause
from runfleet.store.types import (
    Activated,
    CheckedSettle,
    OnParentExit,
    Owner,
    RowLocked,
    RunError,
    RunRow,
    RunStatus,
    Settle,
    TransitionOutcome,
    Waiting,
    WaitingReason,
)
from runfleet.worker import Context, flow
from runfleet.worker.authoring.durable import Handoff
from runfleet.worker.containment import UserBaseException
from runfleet.worker.settle import Settlement, _storable, error_of
from tests.seed_rules import flows as sr
from tests.store.helpers import OWNER_A, OWNER_B, create, make_parked, make_running, must_get

UNDO = "tests.seed_rules.flows:undo"


@flow(name="ts.queued", queue="q-special")
async def queued(ctx: Context) -> str:
    return "done"


UNDONE_ASYNC: list[str] = []


async def undo_async(output: Any) -> None:
    UNDONE_ASYNC.append(str(output))


def undo_that_fails(output: Any) -> None:
    raise RuntimeError(f"cannot undo {output}")


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Calls:
    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []
        self.hinted: list[str] = []

    async def announce(self, run_id: str, status: str) -> None:
        self.announced.append((run_id, status))

    async def hint(self, row: RunRow) -> None:
        self.hinted.append(row.id)


def settlement(store: Store, calls: Calls | None = None, *, group: bool = True) -> Settlement:
    seen = calls or Calls()
    return Settlement(store, OWNER_A, hint=seen.hint, announce=seen.announce, group_commit=group)


async def journal(store: Store, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in await store.journal.records(run_id) if r.kind == kind]


# ---- errors as stored values --------------------------------------------------------


def test_storable_escapes_what_postgres_refuses_and_bounds_the_rest() -> None:
    assert _storable("a\x00b", 100) == "a\\x00b"
    assert _storable("lone \ud800 surrogate", 100) == "lone \\ud800 surrogate"
    assert _storable("x" * 10, 10) == "x" * 10, "at the limit: kept whole"
    assert _storable("abcdefghijk", 10) == "abcdefghij…"
    assert _storable("abcdefghijk", 10, keep_end=True) == "…bcdefghijk"


def test_an_error_is_its_type_message_and_the_end_of_its_traceback() -> None:
    try:
        raise ValueError("bad " + "m" * 9000)
    except ValueError as exc:
        error = error_of(exc)
    assert error.type == "ValueError"
    assert error.message == ("bad " + "m" * 9000)[:8000] + "…"
    trace = error.traceback
    assert trace is not None
    assert len(trace) == 4001 and trace.startswith("…"), "the end of it, where the error is"
    assert trace.endswith("m" * 100 + "\n")

    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert error_of(Hostile()).message == "<Hostile whose str() raised>"
    short = error_of(KeyError("k"))
    assert short.message == "'k'" and "KeyError" in str(short.traceback)


def test_an_errors_module_is_bounded_to_200_characters() -> None:
    class Deep(Exception):
        pass

    Deep.__module__ = "m" * 201
    assert error_of(Deep()).module == "m" * 200 + "…"
    Deep.__module__ = "m" * 200
    assert error_of(Deep()).module == "m" * 200, "at the limit: kept whole"


# ---- endings ------------------------------------------------------------------------


@pytest.mark.parametrize("group", [True, False])
async def test_a_result_completes_the_run_counted_and_announced(store: Store, group: bool) -> None:
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    calls = Calls()
    before = sample("runfleet_settlements_total", status="completed")
    await settlement(store, calls, group=group).result(row, row.epoch, {"n": 1.5}, None)
    done = await must_get(store, "r")
    assert done.status is RunStatus.COMPLETED and done.result == {"n": 1.5}
    assert sample("runfleet_settlements_total", status="completed") == before + 1
    assert calls.announced == [("r", "completed")]
    (record,) = await journal(store, "r", Kind.TRANSITIONED)
    assert record["to"] == "completed" and record["epoch"] == row.epoch


async def test_a_settlement_wakes_and_hints_its_parent_and_hints_live_cascaded_children(
    store: Store,
) -> None:
    parent = await make_running(store, "p", OWNER_A, flow="sr.waiter")
    await create(store, "child", flow="sr.waiter", parent_id="p")
    await create(store, "done-child", flow="sr.waiter", parent_id="p")
    child = await must_get(store, "done-child")
    activated = await store.runs.claim_and_activate("done-child", child.snapshot, OWNER_B)
    assert hasattr(activated, "row")
    await store.lifecycle.transition_owned("done-child", OWNER_B, 1, RunStatus.COMPLETED)
    calls = Calls()
    await settlement(store, calls).finish(
        parent, settlements.failed(parent.id, parent.epoch, RunError())
    )
    assert calls.announced == [("p", "failed")]
    assert calls.hinted == ["child"], "the live child it asked to cancel, not the settled one"


async def test_a_handoff_settles_the_round_admits_the_next_and_hints_it(store: Store) -> None:
    row = await make_running(store, "L", OWNER_A, flow="sr.lineage")
    calls = Calls()
    await settlement(store, calls).result(row, row.epoch, Handoff(sr.lineage, (0,)), 10)
    assert (await must_get(store, "L")).status is RunStatus.COMPLETED
    successor = await must_get(store, "L@1")
    assert successor.status is RunStatus.PENDING and successor.round_ordinal == 1
    assert successor.payload == {"args": [0], "kwargs": {}}
    assert successor.max_rounds == 10 and successor.lineage_id == "L"
    assert calls.hinted == ["L@1"] and calls.announced == [("L", "completed")]
    (record,) = await journal(store, "L", Kind.HANDED_OFF)
    assert (record["successor"], record["round"]) == ("L@1", 1)


@pytest.mark.parametrize("group", [True, False])
async def test_a_handoff_at_the_budget_fails_the_lineage_exhausted(
    store: Store, group: bool
) -> None:
    row = await make_running(store, "L", OWNER_A, flow="sr.lineage")
    await settlement(store, group=group).hand_off(row, row.epoch, Handoff(sr.lineage, (0,)), 1)
    done = await must_get(store, "L")
    assert done.status is RunStatus.FAILED
    assert done.error == RunError(type="LineageExhausted", message="max_rounds=1 reached")
    (record,) = await journal(store, "L", Kind.LINEAGE_EXHAUSTED)
    assert record["max_rounds"] == 1
    assert await store.runs.get("L@1") is None
    row2 = await make_running(store, "M", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row2, row2.epoch, Handoff(sr.lineage, (0,)), 2)
    assert (await must_get(store, "M")).status is RunStatus.COMPLETED, "one round under 2"


async def test_a_handoff_to_a_flow_that_cannot_take_it_fails_the_round_invalid(
    store: Store,
) -> None:
    row = await make_running(store, "L", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row, row.epoch, Handoff(sr.lineage, (1, 2, 3)), 10)
    done = await must_get(store, "L")
    assert isinstance(done.error, RunError) and done.status is RunStatus.FAILED
    assert done.error.type == "InvalidInput" and "too many positional" in str(done.error.message)
    (record,) = await journal(store, "L", Kind.ROUND_INVALID)
    assert record["successor"] == "L@1"
    assert await store.runs.get("L@1") is None
    # The successor's id taken by a different run: nothing of the handoff is written.
    await create(store, "N@1", flow="sr.waiter")
    other = await make_running(store, "N", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(other, other.epoch, Handoff(sr.lineage, (0,)), 10)
    failed = await must_get(store, "N")
    assert failed.status is RunStatus.FAILED and isinstance(failed.error, RunError)
    assert failed.error.type == "ExecutionIdentityConflict"
    (invalid,) = await journal(store, "N", Kind.ROUND_INVALID)
    assert invalid["successor"] == "N@1"
    assert (await must_get(store, "N@1")).flow == "sr.waiter"


async def test_the_successors_deadline_is_explicit_or_the_target_flows_timeout(
    store: Store,
) -> None:
    row = await make_running(store, "T", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row, row.epoch, Handoff(sr.timed), 10)
    timed = await must_get(store, "T@1")
    assert timed.deadline_ms is not None
    assert 29_000 <= timed.deadline_ms - timed.created_at_ms <= 31_000
    at = datetime.now(UTC) + timedelta(hours=1)
    row2 = await make_running(store, "E", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row2, row2.epoch, Handoff(sr.timed, deadline=at), 10)
    assert (await must_get(store, "E@1")).deadline_ms == int(at.timestamp() * 1000)
    row3 = await make_running(store, "U", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row3, row3.epoch, Handoff(sr.waiter), 10)
    assert (await must_get(store, "U@1")).deadline_ms is None


async def test_an_unstorable_result_fails_the_run_once_and_says_why(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="runfleet.worker.settle")
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    calls = Calls()
    before = sample("runfleet_settlements_total", status="failed")
    await settlement(store, calls).result(row, row.epoch, {"bad": "\x00"}, None)
    failed = await must_get(store, "r")
    assert failed.status is RunStatus.FAILED and failed.error is not None
    assert failed.error.type == "UnstorableValue"
    assert calls.announced == [("r", "failed")]
    assert sample("runfleet_settlements_total", status="failed") == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "run.unstorable"]
    assert line.__dict__["run_id"] == "r" and line.__dict__["field"] == "state"
    assert line.__dict__["problem"]


async def test_a_failure_too_big_to_store_is_kept_shortened(store: Store) -> None:
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    huge = RunError(type="Boom", message="m" * (store.settings.max_payload_bytes + 10))
    await settlement(store).finish(row, settlements.failed(row.id, row.epoch, huge))
    failed = await must_get(store, "r")
    assert failed.status is RunStatus.FAILED and failed.error is not None
    assert failed.error == RunError(type="Boom", message="m" * 300), "the run's own error, cut"


async def test_a_settlement_after_a_cancel_request_cancels_instead(store: Store) -> None:
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    await store.lifecycle.request_cancel("r")
    calls = Calls()
    before = sample("runfleet_settlements_total", status="cancelled")
    await settlement(store, calls).result(row, row.epoch, "late", None)
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED
    assert calls.announced == [("r", "cancelled")]
    assert sample("runfleet_settlements_total", status="cancelled") == before + 1


async def test_a_settlement_that_lost_its_fence_writes_nothing_and_says_so(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.settle")
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    calls = Calls()
    stale = Settlement(store, Owner("host-x", 1, "n"), hint=calls.hint, announce=calls.announce)
    await stale.result(row, row.epoch, "mine", None)
    await stale.cancelled(row, row.epoch)
    assert (await must_get(store, "r")).status is RunStatus.RUNNING
    assert calls.announced == [] and calls.hinted == []
    lines = [r for r in caplog.records if r.getMessage() == "run.fence_lost"]
    assert [(r.__dict__["run_id"], r.__dict__["epoch"]) for r in lines] == [
        ("r", row.epoch),
        ("r", row.epoch),
    ]


# ---- cancellation and compensations --------------------------------------------------


async def _with_steps(store: Store, run_id: str, steps: list[tuple[str, str | None]]) -> RunRow:
    row = await make_running(store, run_id, OWNER_A, flow="sr.waiter")
    for position, (key, compensate) in enumerate(steps):
        recorded = await store.steps.record(
            run_id,
            OWNER_A,
            row.epoch,
            key=key,
            name=key,
            kind="step",
            position=position,
            output=f"{run_id}-{key}",
            compensate=compensate,
        )
        assert recorded is not None
    return row


async def test_a_cancel_compensates_completed_steps_newest_first_once(store: Store) -> None:
    sr.UNDONE.clear()
    UNDONE_ASYNC.clear()
    row = await _with_steps(
        store,
        "r",
        [
            ("one", UNDO),
            ("plain", None),
            ("two", "tests.worker.test_settle:undo_async"),
            ("three", UNDO),
        ],
    )
    calls = Calls()
    await settlement(store, calls).cancelled(row, row.epoch)
    assert sr.UNDONE == ["r-three", "r-one"] and UNDONE_ASYNC == ["r-two"]
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED
    assert calls.announced == [("r", "cancelled")]
    compensated = {s.key for s in await store.steps.of_run("r") if s.compensated_at_ms}
    assert compensated == {"one", "two", "three"}
    sr.UNDONE.clear()
    await settlement(store).cancelled(row, row.epoch)  # again: done ones are not repeated
    assert sr.UNDONE == []


async def test_a_failing_or_unregistered_compensation_is_journaled_and_the_rest_run(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="runfleet.worker.settle")
    sr.UNDONE.clear()
    row = await _with_steps(
        store,
        "r",
        [
            ("one", UNDO),
            ("fails", "tests.worker.test_settle:undo_that_fails"),
            ("unknown", "os:system"),
        ],
    )
    await settlement(store).cancelled(row, row.epoch)
    assert sr.UNDONE == ["r-one"]
    failed = await journal(store, "r", Kind.STEP_COMPENSATION_FAILED)
    assert [f["key"] for f in failed] == ["unknown", "fails"]
    assert "cannot undo r-fails" in failed[1]["error"]
    lines = [r for r in caplog.records if r.getMessage() == "step.compensation_failed"]
    assert [(r.__dict__["run_id"], r.__dict__["step"]) for r in lines] == [
        ("r", "unknown"),
        ("r", "fails"),
    ]
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED


async def test_a_compensation_stops_when_the_fence_is_lost(store: Store) -> None:
    sr.UNDONE.clear()
    row = await _with_steps(store, "r", [("one", UNDO), ("two", UNDO)])
    stolen = await store.waits.release(
        "r", OWNER_A, row.epoch, ReleaseCause.INTERRUPTED, "shutdown"
    )
    assert stolen is not None
    await settlement(store).cancelled(row, row.epoch)
    assert sr.UNDONE == ["r-two"], "the first undone; then the fence said stop"
    assert (await must_get(store, "r")).status is not RunStatus.CANCELLED


async def test_a_compensation_never_runs_on_an_output_its_digest_does_not_vouch_for(
    store: Store,
) -> None:
    """A hostile writer with access to the table rewrites a recorded output: the undo is
    refused (journaled) rather than run on data runfleet never recorded."""
    sr.UNDONE.clear()
    row = await _with_steps(store, "r", [("one", UNDO)])
    async with await psycopg.AsyncConnection.connect(
        store.settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(
            "UPDATE runfleet.steps SET output = '\"tampered\"' WHERE run_id = 'r' AND key = 'one'"
        )
    await settlement(store).cancelled(row, row.epoch)
    assert sr.UNDONE == []
    (failed,) = await journal(store, "r", Kind.STEP_COMPENSATION_FAILED)
    assert failed == {"key": "one", "error": "recorded output does not match its digest"}


async def test_a_successor_inherits_the_rounds_scopes_parent_and_lineage(store: Store) -> None:
    await make_running(store, "p", OWNER_B, flow="sr.waiter", scopes=("team-a",))
    await create(
        store,
        "L",
        flow="sr.lineage",
        parent_id="p",
        on_parent_exit=OnParentExit.DETACH,
        scopes=("team-a",),
    )
    first = await must_get(store, "L")
    row = await store.runs.claim_and_activate("L", first.snapshot, OWNER_A)
    assert isinstance(row, Activated)
    await settlement(store).hand_off(row.row, row.row.epoch, Handoff(sr.lineage, (0,), {}), 10)
    successor = await must_get(store, "L@1")
    assert successor.scopes == ("team-a",)
    assert successor.parent == "p" and successor.on_parent_exit is OnParentExit.DETACH
    assert successor.parent_run_id == "L" and successor.lineage_id == "L"


async def test_a_settled_child_hints_the_parent_it_woke(store: Store) -> None:
    await make_parked(
        store, "p", Waiting(WaitingReason.CHILD, token="kid"), OWNER_B, deferred="child:kid"
    )
    kid = await make_running(store, "kid", OWNER_A, flow="sr.waiter", parent_id="p")
    calls = Calls()
    await settlement(store, calls).result(kid, kid.epoch, 5, None)
    assert calls.hinted == ["p"], "the parent its settlement woke, as the waking left it"


def test_an_error_keeps_its_traceback_as_formatted_or_says_it_could_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        raise KeyError("k")
    except KeyError as exc:
        caught = exc
    assert error_of(caught).traceback == "".join(traceback.format_exception(caught))

    def too_deep(_exc: BaseException) -> list[str]:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(settle_module, "traceback", SimpleNamespace(format_exception=too_deep))
    assert error_of(caught).traceback == "<traceback too deep to format>"


@pytest.mark.parametrize(
    ("limit", "stored"),
    [
        (300, {"type": "UnstorableValue", "module": "runfleet.store.values", "traceback": ""}),
        (60, {"type": "UnstorableValue"}),
    ],
)
async def test_an_unstorable_failure_is_shrunk_step_by_step_until_it_fits(
    settings: Settings, limit: int, stored: dict[str, str]
) -> None:
    """Under a small payload limit even the storage error is too big with its traceback
    (then it is kept without one), or at all (then only its type is)."""
    small = await Store.open(settings.model_copy(update={"max_payload_bytes": limit}))
    try:
        row = await make_running(small, "r", OWNER_A, flow="sr.waiter")
        huge = RunError(type="Boom", message="m" * 1000)
        await settlement(small).finish(row, settlements.failed(row.id, row.epoch, huge))
        failed = await must_get(small, "r")
        assert failed.status is RunStatus.FAILED and isinstance(failed.error, RunError)
        assert {k: v for k, v in failed.error.to_json().items() if k != "message"} == stored
        if "traceback" in stored:
            assert failed.error.message, "the storage error's message is what fits"
    finally:
        await small.close()


def flaky(real: Any) -> Any:
    """``real`` failing once with a transient error first (a dropped connection)."""
    failed: list[bool] = []

    async def call(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(*args, **kwargs)

    return call


@pytest.mark.parametrize("ending", ["result", "grouped", "cancel", "handoff"])
async def test_a_settlement_retries_a_dropped_connection_counted_as_settle(
    store: Store, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    row = await make_running(store, "r", OWNER_A, flow="sr.lineage")
    before = sample("runfleet_infrastructure_errors_total", component="settle")
    if ending == "result":
        monkeypatch.setattr(
            store.lifecycle, "transition_owned", flaky(store.lifecycle.transition_owned)
        )
        await settlement(store, group=False).result(row, row.epoch, 1, None)
        expected = RunStatus.COMPLETED
    elif ending == "grouped":
        monkeypatch.setattr(store.lifecycle, "settle_many", flaky(store.lifecycle.settle_many))
        await settlement(store).result(row, row.epoch, 1, None)
        expected = RunStatus.COMPLETED
    elif ending == "cancel":
        await store.lifecycle.request_cancel("r")
        monkeypatch.setattr(store.lifecycle, "settle", flaky(store.lifecycle.settle))
        await settlement(store).cancelled(row, row.epoch)
        expected = RunStatus.CANCELLED
    else:
        monkeypatch.setattr(store.lifecycle, "hand_off", flaky(store.lifecycle.hand_off))
        await settlement(store).hand_off(row, row.epoch, Handoff(sr.lineage, (0,)), 10)
        expected = RunStatus.COMPLETED
    assert (await must_get(store, "r")).status is expected
    assert sample("runfleet_infrastructure_errors_total", component="settle") == before + 1


async def test_a_successor_goes_to_the_queue_its_flow_names(store: Store) -> None:
    row = await make_running(store, "Q", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row, row.epoch, Handoff(queued), 10)
    assert (await must_get(store, "Q@1")).queue == "q-special"


async def test_an_unstorable_settlement_in_a_group_commit_fails_alone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should an unstorable value reach the batch (the per-item check missed it: here it
    hands on a patch text jsonb refuses for a value it passed), it fails its own run only;
    the others committed with it settle as they were. Both items are in one flush (the
    batch statement refuses the bad one for both), so the good run settles only because
    the group commit retries each item alone (``isolate``)."""
    good = await make_running(store, "good", OWNER_A, flow="sr.waiter")
    bad = await make_running(store, "bad", OWNER_A, flow="sr.waiter")
    real_check = store.lifecycle.check

    def missed(item: Settle) -> CheckedSettle:
        checked = real_check(item)
        if item.run_id != "bad" or item.status is not RunStatus.COMPLETED:
            return checked
        return dataclasses.replace(checked, patch='{"bad": "\\u0000"}')  # 22P05 in jsonb

    monkeypatch.setattr(store.lifecycle, "check", missed)
    flushes: list[list[str]] = []
    real_many = store.lifecycle.settle_many

    async def seen(
        owner: Owner, items: Sequence[CheckedSettle]
    ) -> list[TransitionOutcome | RowLocked]:
        flushes.append([c.item.run_id for c in items])
        return await real_many(owner, items)

    monkeypatch.setattr(store.lifecycle, "settle_many", seen)
    both = settlement(store)
    await asyncio.gather(
        both.result(good, good.epoch, {"ok": 1}, None),
        both.result(bad, bad.epoch, {"bad": 1}, None),  # storable: the check passes it
    )
    assert flushes[0] == ["good", "bad"], flushes  # one batch, refused as a whole
    assert ["good"] in flushes[1:], flushes  # then each alone: the good one commits
    assert (await must_get(store, "good")).status is RunStatus.COMPLETED
    failed = await must_get(store, "bad")
    assert failed.status is RunStatus.FAILED and isinstance(failed.error, RunError)
    assert failed.error.type == "UnstorableValue"


# ---- the run's own BaseExceptions, and a hard stop during a compensation ---------------


def test_a_base_exception_of_the_runs_code_is_recorded_as_itself_and_marked() -> None:
    try:
        raise SystemExit("bye")
    except SystemExit as exc:
        original = exc
    error = error_of(UserBaseException(original))
    assert error.type == "SystemExit"
    assert error.message == "SystemExit raised by the run's own code: bye"
    assert error.base_exception is True
    assert error.traceback == "".join(traceback.format_exception(original))
    silent = error_of(UserBaseException(KeyboardInterrupt()))
    assert silent.message == "KeyboardInterrupt raised by the run's own code", "no ': '"
    assert silent.type == "KeyboardInterrupt" and silent.base_exception is True
    assert not error_of(ValueError("plain")).base_exception, "only for BaseExceptions"


def test_a_traceback_whose_formatting_raises_is_said_to_be_unformattable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hostile(_exc: BaseException) -> list[str]:
        raise SystemExit("a __str__ that exits, met while formatting")

    monkeypatch.setattr(settle_module, "traceback", SimpleNamespace(format_exception=hostile))
    error = error_of(KeyError("k"))
    assert error.traceback == "<traceback of KeyError could not be formatted>"


COMPENSATING: list[asyncio.Event] = []
"""Set by ``undo_that_blocks`` once it runs (made by the test, in its own event loop)."""


async def undo_that_cancels_itself(output: Any) -> None:
    """The run's own code raising CancelledError that nobody asked for."""
    raise asyncio.CancelledError(f"my own {output}")


async def undo_that_blocks(output: Any) -> None:
    COMPENSATING[-1].set()
    await asyncio.Event().wait()  # until the settling task is cancelled


async def test_a_compensations_own_cancelled_error_fails_that_compensation_only(
    store: Store,
) -> None:
    sr.UNDONE.clear()
    row = await _with_steps(
        store, "r", [("one", UNDO), ("own", "tests.worker.test_settle:undo_that_cancels_itself")]
    )
    await settlement(store).cancelled(row, row.epoch)
    (failed,) = await journal(store, "r", Kind.STEP_COMPENSATION_FAILED)
    assert failed["key"] == "own"
    assert sr.UNDONE == ["r-one"], "the rest still run"
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED


async def test_a_hard_stop_during_a_compensation_stops_the_settlement(store: Store) -> None:
    COMPENSATING.append(asyncio.Event())
    sr.UNDONE.clear()
    row = await _with_steps(
        store, "r", [("one", UNDO), ("blocks", "tests.worker.test_settle:undo_that_blocks")]
    )
    settling = asyncio.ensure_future(settlement(store).cancelled(row, row.epoch))
    await asyncio.wait_for(COMPENSATING[-1].wait(), 10)
    settling.cancel()  # the drive itself is cancelled (a hard stop), not the run's code
    with pytest.raises(asyncio.CancelledError):
        await settling
    assert await journal(store, "r", Kind.STEP_COMPENSATION_FAILED) == []
    assert sr.UNDONE == [], "nothing more runs"
    assert (await must_get(store, "r")).status is RunStatus.RUNNING, "left to a recovery"


async def test_a_cancel_found_at_a_release_says_which_interrupt_found_it(store: Store) -> None:
    found = await make_running(store, "found", OWNER_A, flow="sr.waiter")
    plain = await make_running(store, "plain", OWNER_A, flow="sr.waiter")
    await settlement(store).cancelled(found, found.epoch, found_at="shutdown")
    await settlement(store).cancelled(plain, plain.epoch)
    (record,) = await journal(store, "found", Kind.INTERRUPTED)
    assert record["cancelled"] is True and record["found_at_release"] == "shutdown"
    cancellation = (await must_get(store, "found")).state["cancellation"]
    assert cancellation["found_at_release"] == "shutdown"
    (ordinary,) = await journal(store, "plain", Kind.INTERRUPTED)
    assert ordinary["cancelled"] is True and "found_at_release" not in ordinary
    assert "found_at_release" not in (await must_get(store, "plain")).state["cancellation"]
