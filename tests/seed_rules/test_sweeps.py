"""Seed rules the sweeps keep: one kind failing never stops the others.

Real Postgres, the production ``Sweeper``; the failures are injected into one kind's read
at a time (the statement raising as a broken query or a lost connection would), and the
dispatch records what each tick handed on.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from runfleet.store import Kind, Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.types import Waiting, WaitingReason
from runfleet.worker.sweeper import Sweeper, SweeperSignals
from tests.store.helpers import create, make_parked, make_running, must_get, wait_db_time_past


async def test_a_failing_sweep_kind_never_stops_the_others(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first kind of a tick (stale running) and one in the middle (due waits) raise;
    the tick still ends normally, the kinds between and after them do their work in the
    same tick (a released run is dispatched, a run past its deadline is asked to cancel),
    and a failed kind's cursor stays where it was, so the next tick tries it again."""
    await make_parked(store, "released", Waiting(WaitingReason.RELEASED))
    await create(store, "overdue", deadline_ms=1)
    dispatched: list[tuple[str, list[str]]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        dispatched.append((reason, sorted(run_ids)))
        return set(run_ids)

    async def broken(*_args: object, **_kwargs: object) -> list[object]:
        raise psycopg.errors.DataError("the kind's read failed")

    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    stale_before = await store.sweeps.cursor(SweepKind.STALE_RUNNING)
    waits_before = await store.sweeps.cursor(SweepKind.DUE_WAITS)
    monkeypatch.setattr(store.sweeps, "stale_running", broken)
    monkeypatch.setattr(store.sweeps, "due_waits", broken)
    signals = SweeperSignals()
    sweeper = Sweeper(store, settings, dispatch, signals=signals)
    counted = [_errors(f"sweep:{kind}") for kind in ("stale_running", "due_waits")]
    await sweeper.tick()  # raises nothing: each failure is logged and counted
    await signals.swept.wait(0)  # and the tick says it ended
    assert [_errors(f"sweep:{kind}") for kind in ("stale_running", "due_waits")] == [
        n + 1 for n in counted
    ]
    failed = [r for r in caplog.records if r.getMessage() == "sweep.failed"]
    assert [r.__dict__["kind"] for r in failed] == ["STALE_RUNNING", "DUE_WAITS"], failed
    assert all("the kind's read failed" in r.__dict__["error"] for r in failed)
    assert all(r.exc_info is not None for r in failed), "with the traceback"

    assert ("sweep:parked", ["released"]) in dispatched, dispatched
    overdue = await must_get(store, "overdue")
    assert overdue.cancel_requested_at_ms is not None, "the deadline kind ran after a failure"
    assert ("sweep:deadline_passed", ["overdue"]) in dispatched, dispatched
    assert (await store.sweeps.cursor(SweepKind.STALE_RUNNING)).after == stale_before.after
    assert (await store.sweeps.cursor(SweepKind.DUE_WAITS)).after == waits_before.after


def _errors(label: str) -> float:
    return (
        REGISTRY.get_sample_value("runfleet_infrastructure_errors_total", {"component": label})
        or 0.0
    )


async def test_a_row_whose_write_fails_is_skipped_logged_and_counted(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One run's deadline cancel raises (injected): that run alone is not dispatched,
    the others past their deadline are, and the failure is logged with the run and
    counted as the deadline kind's infrastructure error."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    for run_id in ("late-1", "late-2", "late-3"):
        await create(store, run_id, deadline_ms=1)
    real = store.lifecycle.request_cancel

    async def refusing(run_id: str, **kwargs: Any) -> Any:
        if run_id == "late-2":
            raise psycopg.errors.DataError("a row Postgres refused")
        return await real(run_id, **kwargs)

    monkeypatch.setattr(store.lifecycle, "request_cancel", refusing)
    dispatched: list[tuple[str, list[str]]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        dispatched.append((reason, sorted(run_ids)))
        return set(run_ids)

    before = _errors("sweep:deadline_passed")
    await Sweeper(store, settings, dispatch).tick()
    assert ("sweep:deadline_passed", ["late-1", "late-3"]) in dispatched, dispatched
    assert (await must_get(store, "late-2")).cancel_requested_at_ms is None
    assert _errors("sweep:deadline_passed") == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "sweep.row_failed"]
    assert line.__dict__["kind"] == "deadline_passed" and line.__dict__["run_id"] == "late-2"
    assert "a row Postgres refused" in line.__dict__["error"]


async def test_a_cursor_that_cannot_move_is_logged_and_its_stretch_read_again(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cursor's move fails after a dispatch (injected): logged and counted; the next
    tick reads the same stretch again (duplicates only, never a row skipped)."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    for n in range(3):
        await make_parked(store, f"rel-{n}", Waiting(WaitingReason.RELEASED))
    small = settings.model_copy(update={"sweep_batch": 2})
    offered: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:parked":
            offered.append(sorted(run_ids))
        return set(run_ids)

    async def broken(*_args: object, **_kwargs: object) -> object:
        raise ConnectionError("the cursor's write was lost")

    sweeper = Sweeper(store, small, dispatch)
    before = _errors("sweep:parked")
    with monkeypatch.context() as patch:
        patch.setattr(store.sweeps, "advance_locked", broken)
        await sweeper.tick()
    assert _errors("sweep:parked") == before + 1
    failed = [
        r
        for r in caplog.records
        if r.getMessage() == "sweep.cursor_failed" and r.__dict__["kind"] == "PARKED"
    ]
    assert len(failed) == 1, caplog.records
    assert "the cursor's write was lost" in failed[0].__dict__["error"]
    await sweeper.tick()
    await sweeper.tick()
    assert offered[:2] == [["rel-0", "rel-1"], ["rel-0", "rel-1"]], offered
    assert "rel-2" in offered[2], offered


async def test_pending_cancellations_are_walked_in_creation_order_across_ticks(
    store: Store, settings: Settings
) -> None:
    """Cancelled runs nobody will execute, more than one batch of them: each tick closes
    the next batch after the cursor (creation time, then id), so all are dispatched
    within ceil(N / batch) ticks."""
    ids = [f"pc-{n}" for n in range(5)]
    for run_id in ids:
        await create(store, run_id)
        await store.lifecycle.request_cancel(run_id)
    small = settings.model_copy(update={"sweep_batch": 2})
    batches: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:pending_cancellations":
            batches.append(list(run_ids))
        return set(run_ids)

    sweeper = Sweeper(store, small, dispatch)
    for _ in range(3):
        await sweeper.tick()
    assert batches == [["pc-0", "pc-1"], ["pc-2", "pc-3"], ["pc-4", "pc-0"]], batches


async def test_the_sweeper_service_ticks_every_interval_and_sweeps_a_stale_lease(
    store: Store, settings: Settings
) -> None:
    """Started as a service, the sweeper ticks on its own, one sweep interval apart
    (jittered), until stopped; its stale-running kind hands on a run whose owner stopped
    renewing, on the recovery reason of that kind."""
    row = await make_running(store, "stale")
    assert row.heartbeat_at_ms is not None
    await wait_db_time_past(store, row.heartbeat_at_ms + settings.stale_after_ms)
    dispatched: list[tuple[str, list[str]]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        dispatched.append((reason, sorted(run_ids)))
        return set(run_ids)

    signals = SweeperSignals()
    sweeper = Sweeper(store, settings, dispatch, signals=signals)
    sweeper.start()
    try:
        for _ in range(3):
            await signals.swept.wait(settings.sweep_interval * 20)
    finally:
        sweeper.stop()
        assert await sweeper.wait_stopped(10)
    assert ("sweep:stale_running", ["stale"]) in dispatched, dispatched


async def test_a_tick_with_nothing_to_sweep_fails_nothing(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """An empty keyset for every kind, on the first tick and after it: nothing is
    dispatched and no kind fails (a walk must not index an empty batch)."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    offered: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        offered.append(run_ids)
        return set(run_ids)

    sweeper = Sweeper(store, settings, dispatch)
    for _ in range(2):
        await sweeper.tick()
    assert offered == []
    assert [r.getMessage() for r in caplog.records] == []


async def test_a_failed_dispatch_is_logged_with_its_kind(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    await make_parked(store, "released", Waiting(WaitingReason.RELEASED))

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        raise ConnectionError("Redis refused the wakes")

    await Sweeper(store, settings, dispatch).tick()
    (line,) = [r for r in caplog.records if r.getMessage() == "sweep.dispatch_failed"]
    assert line.__dict__["kind"] == "PARKED"
    assert "Redis refused the wakes" in line.__dict__["error"]


async def test_a_run_past_its_deadline_is_asked_to_cancel_by_the_deadline(
    store: Store, settings: Settings
) -> None:
    """The deadline kind cancels through the ordinary cancel path, journaled as the
    deadline's: ``note`` and ``reason`` both ``deadline``."""
    await create(store, "overdue", deadline_ms=1)

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set(run_ids)

    await Sweeper(store, settings, dispatch).tick()
    assert (await must_get(store, "overdue")).cancel_requested_at_ms is not None
    (record,) = [
        r for r in await store.journal.records("overdue") if r.kind == Kind.CANCEL_REQUESTED
    ]
    assert (record.payload["note"], record.payload["reason"]) == ("deadline", "deadline")


async def test_the_deadline_sweep_asks_one_batch_a_tick_and_walks_past_a_failing_run(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of one: each tick asks at most one run past its deadline, after the
    kind's cursor, so a run whose cancel keeps failing does not hold back the next."""
    for run_id in ("late-1", "late-2"):
        await create(store, run_id, deadline_ms=1)
    real = store.lifecycle.request_cancel

    async def refusing(run_id: str, **kwargs: Any) -> Any:
        if run_id == "late-1":
            raise psycopg.errors.DataError("a row Postgres refused")
        return await real(run_id, **kwargs)

    monkeypatch.setattr(store.lifecycle, "request_cancel", refusing)

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set(run_ids)

    sweeper = Sweeper(store, settings.model_copy(update={"sweep_batch": 1}), dispatch)
    await sweeper.tick()
    assert (await must_get(store, "late-2")).cancel_requested_at_ms is None, "one a tick"
    await sweeper.tick()
    assert (await must_get(store, "late-2")).cancel_requested_at_ms is not None
    assert (await must_get(store, "late-1")).cancel_requested_at_ms is None


async def test_a_lost_pending_run_is_woken_once_a_cycle(store: Store, settings: Settings) -> None:
    """A pending run admitted before its queue's wake mark (its message delivered or
    destroyed, and never claimed) is lost: the lost-pending kind dispatches it, and not
    again until ``lost_pending_after_ms`` of database time has passed since that cycle
    began, although it is still lost (its mark is far ahead of its new wake)."""
    await create(store, "lost")
    queue = (await must_get(store, "lost")).queue
    await store.sweeps.advance_wake_mark(queue, await store.stats.now_ms() + 3_600_000)
    lost: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:lost_pending":
            lost.append(sorted(run_ids))
        return set(run_ids)

    sweeper = Sweeper(store, settings, dispatch)
    await sweeper.tick()
    assert lost == [["lost"]]
    await sweeper.tick()
    await sweeper.tick()
    assert lost == [["lost"]], "woken once a cycle, not once a tick"
