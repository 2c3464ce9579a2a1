"""How a worker process stops and hears cancels (``worker.process``), in the test's loop.

A graceful stop gives running runs the grace period and then releases what is left; a
hard stop (or a second stop) releases at once. Closing clears the liveness key and says
``worker.stopped``. A cancel publish interrupts an owned run whose row asks for it, and
only such a run; a failed row read is counted and logged, and the listener goes on.
The operator's view (log events, their fields, the infrastructure-error counter) is
asserted as they read it. Real Postgres and Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
import redis.exceptions
from prometheus_client import REGISTRY

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.producer import AsyncQueue, RunCancelled
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunRow, RunStatus
from runfleet.worker import Context, flow
from runfleet.worker.authoring.durable import Cause
from runfleet.worker.process import Worker
from tests.fleet.procs import records
from tests.support.polling import until
from tests.support.workers import running

PROCESS_LOG = "runfleet.worker.process"

STARTED: dict[str, asyncio.Event] = {}
OPEN: dict[str, asyncio.Event] = {}
INTERRUPTED: dict[str, tuple[float, Cause | None]] = {}
"""When (loop time) and why (``ctx.interrupted``) runfleet stopped a held body, by token."""
UNDONE: list[str] = []
"""The tokens whose booking step was compensated."""


async def _book(token: str) -> str:
    return token


async def _unbook(token: str) -> None:
    UNDONE.append(token)


@flow(name="tests.worker.process_shutdown.held")
async def held(ctx: Context, token: str) -> str:
    """One compensated step, then runs until the test opens its gate; notes when and why
    runfleet stops it."""
    await ctx.step("book", _book, token, compensate=_unbook)
    STARTED[token].set()
    try:
        await OPEN[token].wait()
    except asyncio.CancelledError:
        INTERRUPTED[token] = (asyncio.get_running_loop().time(), ctx.interrupted)
        raise
    return f"opened:{token}"


def _token(name: str) -> str:
    STARTED[name], OPEN[name] = asyncio.Event(), asyncio.Event()
    INTERRUPTED.pop(name, None)
    while name in UNDONE:
        UNDONE.remove(name)
    return name


@asynccontextmanager
async def _running(settings: Settings) -> AsyncIterator[tuple[Worker, asyncio.Task[None]]]:
    """A started worker; stopped hard and awaited on the way out if the test did not."""
    w = Worker(settings, queues=["default"], concurrency=4)
    async with running(w) as task:
        yield w, task


async def _started(queue: AsyncQueue, token: str) -> str:
    run = await queue.enqueue(held, token)
    await asyncio.wait_for(STARTED[token].wait(), 10)
    return run.id


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == PROCESS_LOG and r.getMessage() == event]


async def _released(store: Store, run_id: str, token: str) -> RunRow:
    row = await store.runs.get(run_id)
    assert row is not None and row.status is RunStatus.SUSPENDED, row
    assert row.waiting is not None and row.waiting.reason == "released", row
    (release,) = await records(store, run_id, "interrupt-released")
    assert release.payload["detail"] == "shutdown", release.payload
    assert token not in UNDONE, "a release is not a cancel: no compensation runs"
    return row


# ---- stop and drain --------------------------------------------------------------


async def test_a_graceful_stop_waits_the_grace_period_then_releases_what_is_left(
    settings: Settings, queue: AsyncQueue, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    graceful = settings.model_copy(update={"grace_period": 1.0})
    token = _token("graceful")
    caplog.set_level(logging.INFO, logger=PROCESS_LOG)
    async with _running(graceful) as (w, task):
        run_id = await _started(queue, token)
        stopped_at = asyncio.get_running_loop().time()
        w.stop()
        await asyncio.wait_for(asyncio.shield(task), 10)
    interrupted_at, cause = INTERRUPTED[token]
    assert cause is Cause.SHUTDOWN
    waited = interrupted_at - stopped_at
    assert waited >= graceful.grace_period - 0.05, f"interrupted {waited:.2f}s after the stop"
    (releasing,) = _logged(caplog, "worker.releasing")
    assert releasing.__dict__["runs"] == 1
    await _released(store, run_id, token)


@pytest.mark.parametrize("how", ["hard", "twice"])
async def test_a_hard_stop_or_a_second_stop_releases_at_once(
    how: str, settings: Settings, queue: AsyncQueue, store: Store
) -> None:
    """Long before the grace period (30 s) would end."""
    patient = settings.model_copy(update={"grace_period": 30.0})
    token = _token(f"hard-{how}")
    async with _running(patient) as (w, task):
        run_id = await _started(queue, token)
        if how == "hard":
            w.stop(hard=True)
        else:
            w.stop()
            w.stop()
        await asyncio.wait_for(asyncio.shield(task), 10)
    assert INTERRUPTED[token][1] is Cause.SHUTDOWN
    await _released(store, run_id, token)


# ---- close -----------------------------------------------------------------------


async def test_a_stopped_worker_clears_its_liveness_key_and_says_so(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Probes see the process gone at once, not after the key's TTL (30 s here)."""
    slow = settings.model_copy(update={"heartbeat_interval": 10.0, "stale_after": 60.0})
    caplog.set_level(logging.INFO, logger=PROCESS_LOG)
    client = connect(slow)
    liveness = Liveness.for_settings(client, slow)
    try:
        async with _running(slow) as (w, task):

            async def members() -> list[str]:
                return [m.owner.key for m in await liveness.fleet()]

            await until(members, 10, "the liveness key", accept=lambda keys: w.owner.key in keys)
            w.stop()
            await asyncio.wait_for(asyncio.shield(task), 10)
        assert w.owner.key not in await members()
    finally:
        await client.aclose()
    assert _logged(caplog, "liveness.clear_failed") == []
    (stopped,) = _logged(caplog, "worker.stopped")
    assert stopped.__dict__["owner"] == w.owner.key


async def test_a_failed_liveness_clear_is_logged_and_the_worker_still_stops(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PROCESS_LOG)
    gone = redis.exceptions.ConnectionError("redis went away")
    async with _running(settings) as (w, task):

        async def refused(*_args: object, **_kwargs: object) -> None:
            raise gone

        w.liveness.clear = refused  # type: ignore[method-assign]  # Redis refuses the delete
        w.stop()
        await asyncio.wait_for(asyncio.shield(task), 10)
    (failed,) = _logged(caplog, "liveness.clear_failed")
    assert failed.levelno == logging.WARNING
    assert failed.__dict__["error"] == repr(gone)
    assert len(_logged(caplog, "worker.stopped")) == 1


# ---- the cancel listener ---------------------------------------------------------

# The lease's poll of cancel requests runs every heartbeat (20 s here): a run cancelled
# within five seconds was cancelled by the publish.
POLL_FAR = {"heartbeat_interval": 20.0, "stale_after": 120.0}


async def _listening(w: Worker) -> None:
    """Until the worker's cancel subscription is confirmed: a publish now reaches it."""
    channel = w.notifier.channel("cancel")

    async def subscribers() -> int:
        counts = dict(await w._redis.pubsub_numsub(channel))
        return int(counts.get(channel.encode(), counts.get(channel, 0)))

    await until(subscribers, 10, "the cancel subscription", accept=lambda n: n >= 1)


async def test_a_cancel_publish_interrupts_only_an_owned_run_whose_row_asks_for_it(
    settings: Settings, queue: AsyncQueue, store: Store
) -> None:
    """A notice with no cancel request behind it (anyone may publish) changes nothing."""
    polled_late = settings.model_copy(update=POLL_FAR)
    kept, cancelled = _token("kept"), _token("cancelled")
    async with _running(polled_late) as (w, _task):
        await _listening(w)
        kept_id = await _started(queue, kept)
        cancelled_id = await _started(queue, cancelled)
        assert await w.notifier.publish_cancel(kept_id)  # no request in its row
        await queue.cancel(cancelled_id)  # notices are handled one at a time, in order
        with pytest.raises(RunCancelled):
            await queue.run(cancelled_id).result(timeout=5)
        journal = await store.journal.records(cancelled_id)
        kinds = [r.kind for r in journal][-3:]
        assert kinds == ["cancel-requested", "step-compensated", "interrupted"], journal
        assert "found_at_release" not in journal[-1].payload, journal[-1].payload
        assert UNDONE.count(cancelled) == 1, "a cancel runs the compensations of its steps"
        assert INTERRUPTED[cancelled][1] is Cause.CANCELLED
        assert kept not in INTERRUPTED, "a notice without a request interrupted a run"
        OPEN[kept].set()
        assert await queue.run(kept_id).result(timeout=10) == f"opened:{kept}"
    assert kept not in UNDONE


async def test_a_failed_cancel_check_is_counted_and_logged_and_the_listener_goes_on(
    settings: Settings,
    queue: AsyncQueue,
    store: Store,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polled_late = settings.model_copy(update=POLL_FAR)
    token = _token("unchecked")
    caplog.set_level(logging.INFO, logger=PROCESS_LOG)
    outage = psycopg.OperationalError("the database went away")

    def counted() -> float:
        labels = {"component": "cancel-listener"}
        return REGISTRY.get_sample_value("runfleet_infrastructure_errors_total", labels) or 0.0

    async with _running(polled_late) as (w, task):
        await _listening(w)
        run_id = await _started(queue, token)
        before = counted()
        real_get = w.store.runs.get
        down: list[str] = []

        async def get_once_down(wanted: str, *args: object, **kwargs: object) -> RunRow | None:
            if wanted == run_id and not down:
                down.append(wanted)
                raise outage
            return await real_get(wanted, *args, **kwargs)

        monkeypatch.setattr(w.store.runs, "get", get_once_down)
        await queue.cancel(run_id)

        async def check_failed() -> list[logging.LogRecord]:
            return _logged(caplog, "cancel.check_failed")

        (failed,) = await until(check_failed, 5, "the failed check to be logged")
        assert failed.levelno == logging.WARNING
        assert (failed.__dict__["run_id"], failed.__dict__["error"]) == (run_id, repr(outage))
        assert counted() == before + 1
        assert not task.done() and token not in INTERRUPTED
        assert await w.notifier.publish_cancel(run_id)  # the next notice is acted on
        with pytest.raises(RunCancelled):
            await queue.run(run_id).result(timeout=5)
        assert INTERRUPTED[token][1] is Cause.CANCELLED
