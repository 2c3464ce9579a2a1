"""The worker's own output lines for a run, as ``Settlement`` logs them: ``run.started``
when its body starts here, one ending line per settlement (``run.completed`` and
``run.cancelled`` at info with the milliseconds since the start, ``run.failed`` at warning
with the error and its traceback). In process against the real store; the same lines
from a real worker process are checked in ``tests/fleet/test_burst.py``.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import psycopg
import pytest

import runfleet.worker.settle as settle_module
from runfleet.store import Store, settlements
from runfleet.store.config import Settings
from runfleet.store.types import RunError, RunStatus
from tests.store.helpers import OWNER_A, make_running, must_get
from tests.worker.test_settle import settlement

LOGGER = "runfleet.worker.settle"


def lines(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.getMessage() == message]


async def test_a_run_logs_its_start_and_its_completion_with_the_milliseconds_between(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    settle = settlement(store)
    settle.began(row)
    (started,) = lines(caplog, "run.started")
    assert started.levelno == logging.INFO
    fields = {k: getattr(started, k) for k in ("run_id", "flow", "queue", "epoch")}
    assert fields == {"run_id": "r", "flow": "sr.waiter", "queue": row.queue, "epoch": 1}
    await asyncio.sleep(0.05)
    await settle.result(row, row.epoch, "done", None)
    (completed,) = lines(caplog, "run.completed")
    assert completed.levelno == logging.INFO
    assert (completed.run_id, completed.flow) == ("r", "sr.waiter")  # type: ignore[attr-defined]  # a log record's extra fields
    assert 50 <= completed.ms < 10_000, completed.ms  # type: ignore[attr-defined]  # a log record's extra fields
    assert not hasattr(completed, "error") and not hasattr(completed, "traceback")


async def test_a_failed_run_logs_its_error_and_traceback_as_a_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    try:
        raise ValueError("boom")
    except ValueError as exc:
        await settlement(store).failed(row, row.epoch, exc)
    (failed,) = lines(caplog, "run.failed")
    assert failed.levelno == logging.WARNING
    assert (failed.run_id, failed.flow) == ("r", "sr.waiter")  # type: ignore[attr-defined]  # a log record's extra fields
    assert failed.error == "ValueError: boom"  # type: ignore[attr-defined]  # a log record's extra fields
    assert 'raise ValueError("boom")' in failed.traceback  # type: ignore[attr-defined]  # a log record's extra fields
    assert not hasattr(failed, "ms"), "its body never started in this process"
    assert not lines(caplog, "run.completed") and not lines(caplog, "run.cancelled")


async def test_a_cancelled_run_logs_run_cancelled_with_its_milliseconds(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    settle = settlement(store)
    settle.began(row)
    await store.lifecycle.request_cancel("r")
    await settle.result(row, row.epoch, "late", None)
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED
    (cancelled,) = lines(caplog, "run.cancelled")
    assert cancelled.levelno == logging.INFO and cancelled.run_id == "r"  # type: ignore[attr-defined]  # a log record's extra fields
    assert 0 <= cancelled.ms < 10_000  # type: ignore[attr-defined]  # a log record's extra fields
    assert not lines(caplog, "run.completed") and not lines(caplog, "run.failed")


async def test_a_run_whose_execution_ended_here_logs_no_milliseconds(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """``ended`` forgets the start (the run parked, was released or lost): a settlement
    after it, here or after a takeover, has no start to measure from. A drive calls it
    however the run ended, so it forgets a run it no longer (or never) knew quietly."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    other = await make_running(store, "o", OWNER_A, flow="sr.waiter")
    settle = settlement(store)
    settle.began(row)
    settle.began(other)
    settle.ended("r")
    await settle.result(row, row.epoch, "done", None)
    await settle.result(other, other.epoch, "done", None)
    settle.ended("o")  # as a drive does once its settlement logged the ending
    settle.ended("never-began")  # as one interrupted before its body started
    first, second = lines(caplog, "run.completed")
    assert first.run_id == "r" and not hasattr(first, "ms")  # type: ignore[attr-defined]  # a log record's extra fields
    assert second.run_id == "o" and second.ms >= 0, "only the run that ended was forgotten"  # type: ignore[attr-defined]  # a log record's extra fields


async def test_at_warning_only_a_failure_is_logged(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    bad = await make_running(store, "b", OWNER_A, flow="sr.waiter")
    settle = settlement(store)
    settle.began(row)
    await settle.result(row, row.epoch, "done", None)
    await settle.failed(bad, bad.epoch, ValueError("boom"))
    assert (await must_get(store, "r")).status is RunStatus.COMPLETED
    logged = [r for r in caplog.records if r.name == LOGGER]
    assert [(r.getMessage(), r.run_id) for r in logged] == [("run.failed", "b")]  # type: ignore[attr-defined]  # a log record's extra fields


async def test_a_run_failed_for_an_unstorable_value_names_the_error_it_failed_with(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A result that cannot be stored fails the run: its line names the storage error. A
    failure too big to store is stored cut, and its line names that failure, not the
    storage error."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    await settlement(store).result(row, row.epoch, {"bad": "\x00"}, None)
    (unstorable,) = lines(caplog, "run.failed")
    assert unstorable.error.startswith("UnstorableValue: "), unstorable.error  # type: ignore[attr-defined]  # a log record's extra fields
    caplog.clear()
    big = await make_running(store, "b", OWNER_A, flow="sr.waiter")
    huge = RunError(type="Boom", message="m" * (store.settings.max_payload_bytes + 10))
    await settlement(store).finish(big, settlements.failed(big.id, big.epoch, huge))
    (too_big,) = lines(caplog, "run.failed")
    assert too_big.error.startswith("Boom: mmm"), too_big.error[:100]  # type: ignore[attr-defined]  # a log record's extra fields


async def test_a_run_the_batch_left_out_for_its_locked_row_is_logged_and_settled_alone(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Its row locked elsewhere (as its producer may hold it), the group commit goes on
    without it: ``run.settle_alone_locked`` names the run, which then waits for its own row
    and settles once the lock is let go."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    async with await psycopg.AsyncConnection.connect(settings.database_url) as holder:
        await holder.execute("SELECT 1 FROM runfleet.runs WHERE id = 'r' FOR UPDATE")
        settling = asyncio.create_task(settlement(store).result(row, row.epoch, "done", None))
        for _ in range(200):
            if lines(caplog, "run.settle_alone_locked"):
                break
            await asyncio.sleep(0.05)
        (alone,) = lines(caplog, "run.settle_alone_locked")
        assert alone.run_id == "r" and not settling.done()  # type: ignore[attr-defined]  # a log record's extra fields
        await holder.commit()
    await asyncio.wait_for(settling, 10)
    assert (await must_get(store, "r")).status is RunStatus.COMPLETED


async def test_a_settlement_waiting_for_its_locked_row_is_set_aside_under_its_run_id(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Settled alone on a store whose lock waits are bounded (a worker's), a run whose row
    stays locked is set aside and tried again: ``run.set_aside`` names the run and the
    write, once, and the run settles when the lock is let go."""
    caplog.set_level(logging.INFO, logger="runfleet.worker.retry")
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    bounded = await Store.open(settings, lock_timeout_ms=50)
    try:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as holder:
            await holder.execute("SELECT 1 FROM runfleet.runs WHERE id = 'r' FOR UPDATE")
            settle = settlement(bounded)
            settling = asyncio.create_task(settle.result(row, row.epoch, "done", None))
            for _ in range(200):
                if _set_aside(caplog):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # tried again meanwhile, still locked: logged once
            (aside,) = _set_aside(caplog)
            assert (aside.run_id, aside.write) == ("r", "settle")  # type: ignore[attr-defined]  # a log record's extra fields
            assert not settling.done()
            await holder.commit()
        await asyncio.wait_for(settling, 10)
    finally:
        await bounded.close()
    assert (await must_get(store, "r")).status is RunStatus.COMPLETED


def _set_aside(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "run.set_aside"]


async def test_the_ending_lines_ms_are_the_milliseconds_since_the_start(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    settle = settlement(store)
    clock = iter([100.0, 112.5])  # the start, then the ending: 12.5 s apart
    monkeypatch.setattr(settle_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    settle.began(row)
    await settle.result(row, row.epoch, "done", None)
    (completed,) = lines(caplog, "run.completed")
    assert completed.ms == 12_500  # type: ignore[attr-defined]  # a log record's extra fields
