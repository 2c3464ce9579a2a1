"""One lifecycle for every service (``runtime.service``): the same rules hold for each.

Stopping twice or before starting is harmless, a service runs once, either edge can be
awaited, and a service that crashes inside the worker's TaskGroup ends the group: the
worker stops loudly instead of limping on without it (STYLE rule 7).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from runfleet.broker.client import connect
from runfleet.broker.notify import Notifier
from runfleet.broker.streams import Streams
from runfleet.runtime.service import Lifecycle, Service, Signal
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.driver import Driver
from runfleet.worker.intake import Intake
from runfleet.worker.lease import Lease
from runfleet.worker.outbox import Outbox
from runfleet.worker.retention import RetentionLoop, RetentionSignals
from runfleet.worker.scheduler import Scheduler, SchedulerSignals
from runfleet.worker.sweeper import Sweeper, SweeperSignals
from runfleet.worker.watchdog import Watchdog

Factory = Callable[[Store, Settings, Redis], Lifecycle]


async def _no_dispatch(_run_ids: list[str], _reason: str) -> set[str]:
    return set()


def _lease(store: Store, settings: Settings, _redis: Redis) -> Lifecycle:
    owner = Owner.for_this_process(settings.host_id)
    return Lease(store, Driver(store, owner, settings), owner, settings)


def _watchdog(_store: Store, _settings: Settings, _redis: Redis) -> Lifecycle:
    return Watchdog(confirmed_sent=lambda: None, executing=lambda: 0, failstop_after=1.0)


FACTORIES: dict[str, Factory] = {
    "lease": _lease,
    "sweeper": lambda store, settings, _r: Sweeper(store, settings, _no_dispatch),
    "scheduler": lambda store, settings, r: Scheduler(
        store, settings, Streams(r, settings.redis_prefix)
    ),
    "retention": lambda store, settings, _r: RetentionLoop(store, settings, None, []),
    "subscription": lambda _s, settings, r: Notifier(r, settings.redis_prefix).subscription(
        "cancel", lambda _n: None
    ),
    "watchdog": _watchdog,
}


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", sorted(FACTORIES))
async def test_every_service_keeps_the_lifecycle_rules(
    kind: str, store: Store, settings: Settings, redis: Redis
) -> None:
    service = FACTORIES[kind](store, settings, redis)
    service.stop()  # before start: harmless, and no stop is remembered
    assert await service.wait_stopped(0)
    assert not await service.wait_started(0.05)
    service.start()
    service.start()  # twice: one body
    assert await service.wait_started(5)
    assert not await service.wait_stopped(0.05), "running until asked to stop"
    service.stop()
    service.stop()  # twice: harmless
    assert await service.wait_stopped(5)
    service.start()  # after a stop: a service runs once
    assert await service.wait_stopped(0)


async def test_started_services_tick_and_say_so(
    store: Store, settings: Settings, redis: Redis
) -> None:
    """The periodic services pass on their own once started; tests wait on the signal."""
    swept, scheduled, pruned = SweeperSignals(), SchedulerSignals(), RetentionSignals()
    services: list[Service] = [
        Sweeper(store, settings, _no_dispatch, signals=swept),
        Scheduler(store, settings, Streams(redis, settings.redis_prefix), signals=scheduled),
        RetentionLoop(store, settings, None, [], interval=0.1, signals=pruned),
    ]
    for service in services:
        service.start()
    try:
        for _ in range(2):  # a second pass: the loop goes on after the first
            await swept.swept.wait()
            assert await scheduled.passed.wait() == 0  # no schedule: nothing admitted
            await pruned.passed.wait()
        assert (await pruned.expired.wait()).deleted.runs == 0
    finally:
        for service in services:
            service.stop()
        for service in services:
            assert await service.wait_stopped(5)


class _Broken(Sweeper):
    """A sweeper with a bug in its pass: not an infrastructure error it may survive."""

    async def tick(self) -> None:
        raise RuntimeError("a bug in the sweeper")


async def test_a_crashed_service_ends_the_task_group(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Started in the worker's TaskGroup, a crash ends the group and stops its siblings."""
    sibling = Sweeper(store, settings, _no_dispatch)
    broken = _Broken(store, settings, _no_dispatch)
    with caplog.at_level(logging.ERROR, logger="runfleet.service"):
        with pytest.raises(ExceptionGroup) as raised:
            async with asyncio.timeout(10), asyncio.TaskGroup() as group:
                sibling.start(group)
                broken.start(group)
                await asyncio.Event().wait()  # the worker's main line, ended by the crash
    assert raised.group_contains(RuntimeError, match="a bug in the sweeper")
    assert await sibling.wait_stopped(0) and not sibling.running
    crashed = [r for r in caplog.records if r.name == "runfleet.service"]
    assert [(r.getMessage(), r.__dict__["service"]) for r in crashed] == [
        ("service.crashed", "sweeper")
    ]


class _LosesItsCancel(Service):
    """A service whose one library call loses the cancel that arrives in it (as redis-py
    sometimes does mid-command) and whose pass goes on; it gives up after 5 s, so that a
    regression fails the test instead of hanging it."""

    name = "loses-its-cancel"

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    async def _serve(self) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                await asyncio.sleep(0.05)  # the library call: this loop's only await
            except asyncio.CancelledError:
                self.lost += 1
            if await self._pause(0):
                return


async def test_a_crash_ends_the_group_even_when_a_siblings_cancel_is_lost(
    store: Store, settings: Settings
) -> None:
    """A sibling cancelled by the group goes on if its cancel was lost in a call; its next
    pause sees the cancel still requested and ends it, so the group ends with the crash."""
    sibling = _LosesItsCancel()
    began = time.monotonic()
    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.timeout(10), asyncio.TaskGroup() as group:
            sibling.start(group)
            await sibling.wait_started(5)
            _Broken(store, settings, _no_dispatch).start(group)
            await asyncio.Event().wait()
    assert raised.group_contains(RuntimeError, match="a bug in the sweeper")
    assert sibling.lost == 1 and await sibling.wait_stopped(0)
    assert time.monotonic() - began < 2


class _StreamsLosingACancel:
    """A stream read that turns a cancel arriving mid-command into a connection error (as
    redis-py sometimes does); after 5 s it lets cancels through, so a regression fails."""

    def __init__(self) -> None:
        self.lost = 0
        self._give_up = time.monotonic() + 5

    async def read(self, *_args: object, **_kwargs: object) -> list[object]:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if time.monotonic() > self._give_up:
                raise
            self.lost += 1
            raise RedisConnectionError("connection lost mid-command") from None
        return []

    async def reclaim(self, *_args: object) -> list[object]:
        return []

    async def ensure_groups(self, _queues: object) -> None:
        return None


class _NothingRunning:
    def __init__(self) -> None:
        self.changed = asyncio.Event()

    def active(self) -> int:
        return 0

    def drive_many(self, _deliveries: object) -> None:
        return None


async def test_the_reader_ends_when_its_cancel_is_lost_in_a_read(
    store: Store, settings: Settings
) -> None:
    """The worker's reader, cancelled by its group while a read is under way, ends even
    if the read lost the cancel as a connection error it retries."""
    streams = _StreamsLosingACancel()
    intake = Intake(
        store=store,
        streams=cast(Streams, streams),
        outbox=cast(Outbox, None),
        coordinator=cast(Coordinator, _NothingRunning()),
        settings=settings,
        owner=Owner.for_this_process(settings.host_id),
        queues=["q"],
        concurrency=1,
        may_claim=lambda: True,
    )
    reader = asyncio.create_task(intake.read_loop(asyncio.Event()))
    await asyncio.sleep(0.2)
    began = time.monotonic()
    reader.cancel()
    try:
        await asyncio.wait_for(asyncio.wait({reader}), 5)
    finally:
        reader.cancel()  # a regression's reader: past the fake's 5 s, its cancel goes through
    assert streams.lost == 1
    assert time.monotonic() - began < 2


async def test_a_crash_through_the_run_adapter_ends_the_task_group(
    store: Store, settings: Settings
) -> None:
    """``run(stop)``, as worker/process.py's side tasks call it: the same property."""
    stop = asyncio.Event()
    sibling = Sweeper(store, settings, _no_dispatch)
    with pytest.raises(ExceptionGroup) as raised:
        async with asyncio.timeout(10), asyncio.TaskGroup() as group:
            group.create_task(sibling.run(stop))
            group.create_task(_Broken(store, settings, _no_dispatch).run(stop))
            await asyncio.Event().wait()
    assert raised.group_contains(RuntimeError, match="a bug in the sweeper")
    assert await sibling.wait_stopped(0)


async def test_the_run_adapter_stops_with_its_event(store: Store, settings: Settings) -> None:
    signals = SweeperSignals()
    sweeper = Sweeper(store, settings, _no_dispatch, signals=signals)
    stop = asyncio.Event()
    task = asyncio.create_task(sweeper.run(stop))
    await signals.swept.wait()
    assert sweeper.running
    stop.set()
    await asyncio.wait_for(task, 5)
    assert await sweeper.wait_stopped(0)
    with pytest.raises(RuntimeError, match="already started"):
        await sweeper.run(stop)


async def test_a_crash_outside_a_group_is_raised_by_wait_stopped(
    store: Store, settings: Settings
) -> None:
    broken = _Broken(store, settings, _no_dispatch)
    broken.start()
    with pytest.raises(RuntimeError, match="a bug in the sweeper"):
        await broken.wait_stopped(5)


# ---- signals -------------------------------------------------------------------------


async def test_a_signal_keeps_what_fired_before_anyone_waited() -> None:
    signal: Signal[int] = Signal()
    signal.fire(1)
    signal.fire(2)
    assert await signal.wait(0.1) == 1
    assert await signal.until(lambda n: n > 1, 0.1) == 2
    with pytest.raises(TimeoutError):
        await signal.wait(0.05)
    signal.fire(3)
    signal.clear()
    with pytest.raises(TimeoutError):
        await signal.wait(0.05)
    assert signal.count == 3


async def test_a_signal_fired_from_a_thread_wakes_an_async_waiter() -> None:
    signal: Signal[str] = Signal()
    began = time.monotonic()
    threading.Timer(0.05, signal.fire, args=("from a thread",)).start()
    assert await signal.wait(2) == "from a thread"
    assert time.monotonic() - began < 1.0


def test_a_worker_runs_16_at_a_time_and_stays_until_stopped_by_default(
    settings: Settings,
) -> None:
    """``Worker(settings)``: concurrency 16, not in burst mode, nothing left behind, and
    stoppable before it runs; any concurrency of at least one is taken, and less is
    refused before anything is built."""
    from runfleet.worker.process import Worker

    worker = Worker(settings)
    assert (worker.concurrency, worker.burst, worker.left_behind) == (16, False, {})
    worker.stop()  # before it runs: nothing built yet, nothing to close
    assert Worker(settings, concurrency=1).concurrency == 1
    with pytest.raises(ValueError, match=r"^concurrency must be >= 1$"):
        Worker(settings, concurrency=0)
