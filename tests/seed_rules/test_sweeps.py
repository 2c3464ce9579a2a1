"""Seed rules the sweeps keep: one kind failing never stops the others.

Real Postgres, the production ``Sweeper``; the failures are injected into one kind's read
at a time (the statement raising as a broken query or a lost connection would), and the
dispatch records what each tick handed on.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import sql

from runfleet.broker.client import connect
from runfleet.broker.streams import Streams
from runfleet.store import Kind, Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.sweeps import START, SweepKey
from runfleet.store.types import Waiting, WaitingReason
from runfleet.worker.sweeper import Sweeper, SweeperSignals
from runfleet.worker.wake_marks import WakeMarks
from tests.store.helpers import (
    OWNER_A,
    create,
    extra_stores,
    make_parked,
    make_running,
    must_get,
    wait_db_time_past,
)


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
    assert all(r.exc_info and r.exc_info[0] is psycopg.errors.DataError for r in failed), (
        "with the traceback"
    )

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
    batches = await _handed(store, small, "sweep:pending_cancellations")
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


async def test_the_deadline_cursor_stops_past_a_failing_run_when_the_next_is_not_dispatched(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run's cancel fails (skipped), the second's is asked but its dispatch is
    not taken: the cursor moves past the failed row, to its key, and stops there."""
    for run_id in ("late-1", "late-2"):
        await create(store, run_id, deadline_ms=1)
    first, _ = await store.sweeps.deadline_passed(limit=2)
    assert first.run_id == "late-1"
    real = store.lifecycle.request_cancel

    async def refusing(run_id: str, **kwargs: Any) -> Any:
        if run_id == "late-1":
            raise psycopg.errors.DataError("a row Postgres refused")
        return await real(run_id, **kwargs)

    monkeypatch.setattr(store.lifecycle, "request_cancel", refusing)

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set() if reason == "sweep:deadline_passed" else set(run_ids)

    await Sweeper(store, settings, dispatch).tick()
    assert (await must_get(store, "late-2")).cancel_requested_at_ms is not None
    assert (await store.sweeps.cursor(SweepKind.DEADLINE_PASSED)).after == first.key


async def test_pending_cancellations_created_in_one_millisecond_are_each_dispatched(
    store: Store, settings: Settings
) -> None:
    """Two cancelled runs admitted in the same database millisecond (a batch admission):
    the cursor is the creation time and the id, so with a batch of one the second tick
    dispatches the second run rather than wrapping back to the first."""
    for run_id in ("same-a", "same-b"):
        await create(store, run_id)
        await store.lifecycle.request_cancel(run_id)
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "UPDATE runfleet.runs SET created_at_ms = (SELECT min(created_at_ms)"
            " FROM runfleet.runs WHERE id IN ('same-a', 'same-b'))"
            " WHERE id IN ('same-a', 'same-b')"
        )
    batches = await _handed(
        store, settings.model_copy(update={"sweep_batch": 1}), "sweep:pending_cancellations"
    )
    assert batches == [["same-a"], ["same-b"], ["same-a"]], batches


def _closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_worker_that_cannot_read_redis_finds_lost_pending_runs_by_their_age(
    store: Store, settings: Settings
) -> None:
    """No wake mark covers either pending run, and this worker's marks cannot read its
    streams (Redis refuses every connection): the lost-pending kind falls back to the age
    rule, dispatching the run admitted more than ``lost_pending_after_ms`` ago and leaving
    the one just admitted."""
    await create(store, "old")
    await create(store, "young")
    queue = (await must_get(store, "old")).queue
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "UPDATE runfleet.runs SET created_at_ms = created_at_ms - %(by)s,"
            " updated_at_ms = updated_at_ms - %(by)s WHERE id = 'old'",
            {"by": 10 * settings.lost_pending_after_ms},
        )
    lost: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:lost_pending":
            lost.append(sorted(run_ids))
        return set(run_ids)

    offline = connect(f"redis://127.0.0.1:{_closed_port()}/0", connect_timeout=0.5)
    try:
        marks = WakeMarks(store, Streams(offline, settings.redis_prefix), [queue], settings)
        await Sweeper(store, settings, dispatch, marks=marks).tick()
        assert marks.redis_unreachable
    finally:
        await offline.aclose()
    assert lost == [["old"]], lost


async def test_a_kind_another_worker_holds_is_left_to_it_for_the_tick(
    store: Store, settings: Settings
) -> None:
    """Another worker holds the parked kind's lock: the tick ends normally without that
    kind (its rows are the holder's this tick), and the next tick, the lock free, takes
    them."""
    await make_parked(store, "released", Waiting(WaitingReason.RELEASED))
    dispatched: list[tuple[str, list[str]]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        dispatched.append((reason, sorted(run_ids)))
        return set(run_ids)

    sweeper = Sweeper(store, settings, dispatch)
    async with extra_stores(settings, 1) as (other,):
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with other.transaction():
                assert await other.sweeps.try_lock(SweepKind.PARKED)
                holding.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.wait_for(holding.wait(), 10)
        try:
            await sweeper.tick()
        finally:
            release.set()
            await holder
    assert ("sweep:parked", ["released"]) not in dispatched, dispatched
    await sweeper.tick()
    assert ("sweep:parked", ["released"]) in dispatched, dispatched


def _sample(name: str, kind: str) -> float:
    return REGISTRY.get_sample_value(name, {"kind": kind}) or 0.0


async def test_each_kind_observes_its_duration_and_batch_and_logs_its_dispatch(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """One tick: the parked kind observes one duration (no longer than the tick) and one
    batch of the two runs it found, under its own label, and logs the dispatch at debug
    level with its kind and how many runs."""
    for run_id in ("rel-a", "rel-b"):
        await make_parked(store, run_id, Waiting(WaitingReason.RELEASED))
    caplog.set_level(logging.DEBUG, logger="runfleet.worker.sweeper")

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set(run_ids)

    durations = "runfleet_sweep_duration_seconds"
    counted = _sample(f"{durations}_count", "parked")
    took = _sample(f"{durations}_sum", "parked")
    batches = _sample("runfleet_sweep_batch_size_count", "parked")
    rows = _sample("runfleet_sweep_batch_size_sum", "parked")
    started = time.monotonic()
    await Sweeper(store, settings, dispatch).tick()
    elapsed = time.monotonic() - started
    assert _sample(f"{durations}_count", "parked") == counted + 1
    assert 0 <= _sample(f"{durations}_sum", "parked") - took <= elapsed
    assert _sample("runfleet_sweep_batch_size_count", "parked") == batches + 1
    assert _sample("runfleet_sweep_batch_size_sum", "parked") == rows + 2
    (line,) = [
        r
        for r in caplog.records
        if r.getMessage() == "sweep.dispatch" and r.__dict__.get("kind") == "PARKED"
    ]
    assert (line.levelno, line.__dict__["runs"]) == (logging.DEBUG, 2)


async def test_a_lost_pending_dispatch_is_recorded_as_the_runs_latest_wake(
    store: Store, settings: Settings
) -> None:
    """The runs the lost-pending kind dispatched are written then (their ``updated_at_ms``
    is the dispatch's database time), so a later cycle counts them lost again only once
    the queue's mark passes that wake too."""
    row = await create(store, "lost")
    await store.sweeps.advance_wake_mark(row.queue, await store.stats.now_ms() + 3_600_000)
    await wait_db_time_past(store, row.updated_at_ms)

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set(run_ids)

    await Sweeper(store, settings, dispatch).tick()
    assert (await must_get(store, "lost")).updated_at_ms > row.updated_at_ms


async def test_a_lost_pending_record_that_fails_is_logged_and_counted(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Recording the dispatched runs' new wake fails (injected): the dispatch stands, the
    failure is logged with the kind and counted as its infrastructure error."""
    row = await create(store, "lost")
    await store.sweeps.advance_wake_mark(row.queue, await store.stats.now_ms() + 3_600_000)
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("the record was lost")

    monkeypatch.setattr(store.sweeps, "redispatched", broken)
    lost: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:lost_pending":
            lost.append(sorted(run_ids))
        return set(run_ids)

    before = _errors("sweep:lost_pending")
    await Sweeper(store, settings, dispatch).tick()
    assert lost == [["lost"]]
    assert _errors("sweep:lost_pending") == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "sweep.record_failed"]
    assert line.__dict__["kind"] == "LOST_PENDING"
    assert "the record was lost" in line.__dict__["error"]


async def test_a_walk_that_wraps_onto_an_empty_keyset_starts_again_from_the_start(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of one over two runs past their deadline: each tick asks one, the cursor
    following; the third finds none after the cursor and none from the start either,
    fails nothing, and puts the cursor back at the start."""
    for run_id in ("late-1", "late-2"):
        await create(store, run_id, deadline_ms=1)
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set(run_ids)

    sweeper = Sweeper(store, settings.model_copy(update={"sweep_batch": 1}), dispatch)
    for _ in range(2):
        await sweeper.tick()
    assert (await store.sweeps.cursor(SweepKind.DEADLINE_PASSED)).after.id == "late-2"
    await sweeper.tick()
    assert [r.getMessage() for r in caplog.records] == []
    assert (await store.sweeps.cursor(SweepKind.DEADLINE_PASSED)).after == START


async def _backdate(settings: Settings, column: str, ago_ms: dict[str, int]) -> None:
    """Set each run's ``column`` (a heartbeat, a last write) ``ago_ms`` before now."""
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        for run_id, ago in ago_ms.items():
            await c.execute(
                sql.SQL(
                    "UPDATE runfleet.runs SET {} = runfleet.now_ms() - %(ago)s WHERE id = %(id)s"
                ).format(sql.Identifier(column)),
                {"ago": ago, "id": run_id},
            )


async def test_stale_running_runs_are_handed_on_one_batch_a_tick_oldest_lease_first(
    store: Store, settings: Settings
) -> None:
    """Three runs whose leases went stale (the last two renewed in the same millisecond)
    and one renewed just now, a batch of one: the ticks hand on the stale ones one at a
    time, oldest lease first, then by id; the fresh one never (its lease is younger
    than ``stale_after``)."""
    for run_id in ("stale-1", "stale-2", "stale-3", "fresh"):
        await make_running(store, run_id)
    await _backdate(
        settings, "heartbeat_at_ms", {"stale-1": 120_000, "stale-2": 90_000, "stale-3": 90_000}
    )
    slow = settings.model_copy(update={"stale_after": 30.0, "sweep_batch": 1})
    handed = await _handed(store, slow, "sweep:stale_running")
    assert handed == [["stale-1"], ["stale-2"], ["stale-3"]], handed


async def test_runnable_suspended_runs_are_handed_on_one_batch_a_tick_after_the_grace(
    store: Store, settings: Settings
) -> None:
    """Suspended runs whose wait was answered but that nobody resumed, a batch of one:
    the ticks hand on those answered longer than ``woken_grace_ms`` ago one at a time,
    oldest first; the one answered just now is left to its own wake."""
    for run_id in ("woken-1", "woken-2", "woken-now"):
        await make_parked(store, run_id, Waiting(WaitingReason.EVENT))
        await store.waits.wake(run_id)
    await _backdate(settings, "updated_at_ms", {"woken-1": 120_000, "woken-2": 90_000})
    slow = settings.model_copy(update={"sweep_interval": 30.0, "sweep_batch": 1})
    assert slow.woken_grace_ms == 60_000
    handed = await _handed(store, slow, "sweep:runnable_suspended")
    assert handed == [["woken-1"], ["woken-2"], ["woken-1"]], handed


async def _fired(store: Store, run_id: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``run_id``'s clocks ``names`` fired."""
    pending = {c.name for c in await store.waits.pending_clocks(run_id)}
    return sorted(set(names) - pending)


async def test_due_clocks_fire_one_batch_a_tick_and_walk_past_one_that_fails(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three clocks of one run due in the same millisecond, the first failing to fire
    (injected), a batch of one: the first tick skips it (logged with its run, counted as
    the kind's error, the run not dispatched), the next two fire the others in name
    order, each dispatching the run; the failing clock is not tried again before them."""
    await make_running(store, "r")
    due = await store.stats.now_ms() - 10
    names = ("c1", "c2", "c3")
    for name in names:
        await store.waits.schedule_clock("r", name, f"{name}:done", due, OWNER_A, 1)
    real = store.waits.complete_clock

    async def refusing(run_id: str, name: str) -> Any:
        if name == "c1":
            raise psycopg.errors.DataError("a clock Postgres refused")
        return await real(run_id, name)

    monkeypatch.setattr(store.waits, "complete_clock", refusing)
    caplog.set_level(logging.WARNING, logger="runfleet.worker.sweeper")
    dispatched: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:due_clocks":
            dispatched.append(sorted(run_ids))
        return set(run_ids)

    before = _errors("sweep:due_clocks")
    sweeper = Sweeper(store, settings.model_copy(update={"sweep_batch": 1}), dispatch)
    fired: list[list[str]] = []
    for _ in range(3):
        await sweeper.tick()
        fired.append(await _fired(store, "r", names))
    assert fired == [[], ["c2"], ["c2", "c3"]], fired
    assert dispatched == [["r"], ["r"]], dispatched
    assert _errors("sweep:due_clocks") == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "sweep.row_failed"]
    assert (line.__dict__["kind"], line.__dict__["run_id"]) == ("due_clocks", "r")
    assert "a clock Postgres refused" in line.__dict__["error"]


async def test_the_clock_cursor_stops_past_a_failing_clock_when_the_next_is_not_dispatched(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of two due clocks fails to fire (skipped), the second fires but its run's
    dispatch is not taken: the cursor moves past the failed clock, to its key, and stops."""
    await make_running(store, "r")
    due = await store.stats.now_ms() - 10
    names = ("c1", "c2")
    for name in names:
        await store.waits.schedule_clock("r", name, f"{name}:done", due, OWNER_A, 1)
    real = store.waits.complete_clock

    async def refusing(run_id: str, name: str) -> Any:
        if name == "c1":
            raise psycopg.errors.DataError("a clock Postgres refused")
        return await real(run_id, name)

    monkeypatch.setattr(store.waits, "complete_clock", refusing)

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        return set() if reason == "sweep:due_clocks" else set(run_ids)

    await Sweeper(store, settings, dispatch).tick()
    assert await _fired(store, "r", names) == ["c2"]
    cursor = await store.sweeps.cursor(SweepKind.DUE_CLOCKS)
    assert cursor.after == SweepKey(due, "r", "c1"), cursor


async def test_due_waits_are_handed_on_one_batch_a_tick(store: Store, settings: Settings) -> None:
    """Two runs parked on timers that are due, a batch of one: each tick hands on the next
    after the kind's cursor, in wake time order, and the walk starts again after the last."""
    for run_id, wake_at_ms in (("timer-1", 1), ("timer-2", 2)):
        await make_parked(store, run_id, Waiting(WaitingReason.TIMER, wake_at_ms=wake_at_ms))
    handed = await _handed(store, settings.model_copy(update={"sweep_batch": 1}), "sweep:due_waits")
    assert handed == [["timer-1"], ["timer-2"], ["timer-1"]], handed


async def test_a_lost_pending_cycle_walks_a_batch_a_tick_up_to_the_tail_it_read(
    store: Store, settings: Settings
) -> None:
    """Twenty lost runs admitted in one database millisecond (a batch admission), a sweep
    batch of one (so a lost-pending batch of 16): the cycle's first tick dispatches the
    first 16 in id order, the second the other 4, and not a run admitted (and lost) after
    the cycle read its tail: that one is left to the next cycle."""
    ids = [f"lost-{n:02d}" for n in range(20)]
    for run_id in ids:
        await create(store, run_id)
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "UPDATE runfleet.runs SET created_at_ms = (SELECT min(created_at_ms)"
            " FROM runfleet.runs WHERE id = ANY(%(ids)s)) WHERE id = ANY(%(ids)s)",
            {"ids": ids},
        )
    queue = (await must_get(store, ids[0])).queue
    await store.sweeps.advance_wake_mark(queue, await store.stats.now_ms() + 3_600_000)
    lost: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason == "sweep:lost_pending":
            lost.append(sorted(run_ids))
        return set(run_ids)

    small = settings.model_copy(update={"sweep_batch": 1})
    assert small.lost_pending_batch == 16
    sweeper = Sweeper(store, small, dispatch)
    await sweeper.tick()
    assert lost == [ids[:16]], lost
    await create(store, "later")
    await sweeper.tick()
    assert lost == [ids[:16], ids[16:]], lost


async def test_a_lost_pending_run_whose_dispatch_failed_is_offered_again_next_tick(
    store: Store, settings: Settings
) -> None:
    """Two lost runs, the first tick's dispatch taking only the first: the cursor moves
    past it alone, so the next tick of the same cycle offers the second again, and only
    it."""
    for run_id in ("lost-a", "lost-b"):
        await create(store, run_id)
    queue = (await must_get(store, "lost-a")).queue
    await store.sweeps.advance_wake_mark(queue, await store.stats.now_ms() + 3_600_000)
    offered: list[list[str]] = []

    async def dispatch(run_ids: list[str], reason: str) -> set[str]:
        if reason != "sweep:lost_pending":
            return set(run_ids)
        offered.append(sorted(run_ids))
        return {"lost-a"} & set(run_ids)

    sweeper = Sweeper(store, settings, dispatch)
    for _ in range(2):
        await sweeper.tick()
    assert offered == [["lost-a", "lost-b"], ["lost-b"]], offered


async def _handed(store: Store, settings: Settings, reason: str) -> list[list[str]]:
    """What three ticks of a sweeper with ``settings`` hand on for ``reason``: each
    dispatch's runs in the order given (every run counts as dispatched)."""
    handed: list[list[str]] = []

    async def dispatch(run_ids: list[str], why: str) -> set[str]:
        if why == reason:
            handed.append(list(run_ids))
        return set(run_ids)

    sweeper = Sweeper(store, settings, dispatch)
    for _ in range(3):
        await sweeper.tick()
    return handed
