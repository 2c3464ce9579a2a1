"""How one worker process wires its collaborators (``worker.process.Worker``).

``_assemble`` builds every part once: the two pools with their server-side timeouts,
the Redis client under its name, the broker pieces over the fleet's prefix, the driver
with its probe, hints, lease and slots, and the services in start order. ``run`` then
gives sync bodies their own thread pool, creates the streams' groups, starts the
services in one TaskGroup, and in ``--burst`` stops once drained. Where nothing outside
the process can see a link (which collaborator holds which), the link itself is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Coroutine, Generator, Iterator
from typing import Any, TypeVar

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from runfleet.broker.gate import Gate
from runfleet.broker.keys import Keys
from runfleet.broker.notify import Subscription
from runfleet.broker.stream_health import StreamHealth
from runfleet.broker.streams import Streams
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.lease import Lease
from runfleet.worker.process import QueueSlots, StreamLag, Worker
from runfleet.worker.queue_gauges import QueueGauges
from runfleet.worker.retention import RetentionLoop
from runfleet.worker.scheduler import Scheduler
from runfleet.worker.sweeper import Sweeper
from runfleet.worker.wake_marks import WakeMarks
from tests.support.workers import running

QUEUES = ["wired-a", "wired-b"]
T = TypeVar("T")


@contextlib.asynccontextmanager
async def assembled(settings: Settings, **kwargs: Any) -> AsyncIterator[Worker]:
    """A worker whose collaborators are built (``_assemble``) but not started."""
    worker = Worker(settings, **kwargs)
    await worker._assemble()
    try:
        yield worker
    finally:
        await worker._close()


async def show(store: Store, setting: str) -> str:
    """The server's value of ``setting`` on one of ``store``'s pooled connections."""
    async with store.db.pool.connection() as conn:
        cur = await conn.execute(f"SHOW {setting}")
        row = await cur.fetchone()
    assert row is not None
    return str(next(iter(row.values())) if isinstance(row, dict) else row[0])


async def test_both_pools_carry_the_owner_queues_sizes_and_server_side_timeouts(
    settings: Settings,
) -> None:
    """The shared pool: at least four connections, lock waits bounded, claims limited to
    the worker's queues, records under the owner's key. The lease pool: one to two
    connections whose statements end server-side after one renewal interval."""
    tuned = settings.model_copy(update={"heartbeat_interval": 1.0, "pool_min": 3, "pool_max": 3})
    async with assembled(tuned, queues=QUEUES, concurrency=2) as worker:
        owner = worker.owner.key
        store, lease_store = worker.store, worker._lease_store

        assert store.db.source_id == owner
        assert (store.db.pool.min_size, store.db.pool.max_size) == (3, max(4, tuned.pool_max))
        assert tuned.worker_lock_wait_ms == 250
        assert await show(store, "lock_timeout") == "250ms"
        assert await show(store, "statement_timeout") == "30s"
        assert store.runs.serves == frozenset(QUEUES)

        assert lease_store.db.source_id == f"{owner}/lease"
        assert (lease_store.db.pool.min_size, lease_store.db.pool.max_size) == (1, 2)
        assert await show(lease_store, "statement_timeout") == "1s"  # renew_timeout
        assert await show(lease_store, "lock_timeout") == "250ms"
        assert lease_store.runs.serves == frozenset(QUEUES)


async def test_a_sub_millisecond_renewal_interval_still_bounds_lease_statements(
    settings: Settings,
) -> None:
    """The lease pool's statement timeout is one renewal interval, never below 1 ms
    (0 would mean no timeout at all)."""
    tiny = settings.model_copy(update={"heartbeat_interval": 0.0005})
    async with assembled(tiny, queues=QUEUES, concurrency=1) as worker:
        kwargs = worker._lease_store.db.pool.kwargs
        assert isinstance(kwargs, dict)
        options = dict(
            pair.split("=", 1) for pair in str(kwargs["options"]).split() if pair != "-c"
        )
        assert options["statement_timeout"] == "1"


async def test_the_redis_client_names_the_owner_and_keys_live_under_the_prefix(
    settings: Settings, redis_client: Redis
) -> None:
    async with assembled(settings, queues=QUEUES, concurrency=2) as worker:
        await worker._redis.ping()
        names = [client["name"] for client in await redis_client.client_list()]
        assert f"runfleet:{worker.owner.key}" in names

        keys = Keys(settings.redis_prefix)
        await worker.streams.ensure_groups(["wired-a"])
        assert await redis_client.exists(keys.stream("wired-a")) == 1
        assert worker.notifier.channel("cancel") == keys.cancel_channel


async def test_the_driver_outbox_gate_and_pump_share_one_set_of_collaborators(
    settings: Settings,
) -> None:
    async with assembled(settings, queues=QUEUES, concurrency=3) as worker:
        driver = worker.driver
        assert driver is not None
        gate = worker.outbox._gate
        assert isinstance(gate, Gate)
        assert gate._redis is worker._redis
        assert gate._streams is worker.streams
        assert worker.outbox._streams is worker.streams
        assert worker.rate_pump._gate is gate
        assert worker.rate_pump._store is worker.store

        assert driver.takeover._probe == worker.liveness.probe
        assert driver._hint == worker.outbox.hint
        assert driver._lease is worker._gate
        assert driver._slots == QueueSlots(worker.outbox, worker.rate_pump)

        sweeper = worker._sweeper
        assert sweeper is not None
        marks = sweeper._marks
        assert isinstance(marks, WakeMarks)
        assert marks._store is worker.store
        assert marks._streams is worker.streams
        assert isinstance(marks._health, StreamHealth)
        assert worker.intake._untrusted == marks.untrusted
        assert worker.intake._queues == QUEUES
        assert worker.intake._concurrency == 3


async def test_the_watchdog_reads_the_lease_and_the_driver_with_the_settings_bounds(
    settings: Settings,
) -> None:
    async with assembled(settings, queues=QUEUES, concurrency=2) as worker:
        await worker.lease.tick()  # a confirmed renewal, as ``run`` makes before starting
        watchdog = worker.watchdog
        sent = worker._gate.confirmed_sent
        assert sent is not None
        assert watchdog._confirmed_sent() == sent
        assert worker.driver is not None
        assert watchdog._executing == worker.driver.running_user_code
        assert watchdog._failstop_after == settings.failstop_after
        assert watchdog._confirm == settings.failstop_confirm > 0


async def test_the_services_in_start_order_over_the_workers_store_and_streams(
    settings: Settings,
) -> None:
    worker = Worker(settings, queues=QUEUES, concurrency=2)
    services = await worker._assemble()
    try:
        kinds = [type(service) for service in services]
        assert kinds == [
            Lease,
            Sweeper,
            Scheduler,
            RetentionLoop,
            Subscription,
            StreamLag,
            QueueGauges,
        ]
        lease, sweeper, scheduler, retention, cancels, lag, gauges = services
        assert lease is worker.lease and sweeper is worker._sweeper
        assert isinstance(scheduler, Scheduler) and scheduler._streams is worker.streams
        assert isinstance(retention, RetentionLoop) and retention._streams is worker.streams
        assert isinstance(cancels, Subscription)
        assert cancels._kind == "cancel"
        assert cancels._callback == worker._on_cancel
        assert isinstance(lag, StreamLag) and lag._streams is worker.streams
        assert isinstance(gauges, QueueGauges) and gauges._store is worker.store
    finally:
        await worker._close()


# ---- run --------------------------------------------------------------------------


class Tasks:
    """Every task the loop creates while installed, to read their names afterwards."""

    def __init__(self) -> None:
        self.created: list[asyncio.Task[Any]] = []

    def __call__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, T] | Coroutine[Any, Any, T],
        /,
        **kwargs: Any,
    ) -> asyncio.Task[T]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.created.append(task)
        return task

    def names(self) -> set[str]:
        return {task.get_name() for task in self.created}


@contextlib.contextmanager
def recording_tasks() -> Iterator[Tasks]:
    loop = asyncio.get_running_loop()
    tasks = Tasks()
    loop.set_task_factory(tasks)
    try:
        yield tasks
    finally:
        loop.set_task_factory(None)


async def test_a_running_worker_gives_sync_bodies_a_named_pool_sized_to_its_concurrency(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Two threads per run slot and four spare (a sync body holds one, each sync step
    one more), named ``runfleet-run``; the streams' groups exist; the reader is a task
    named ``reader``."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.process")
    worker = Worker(settings, queues=["wired-a"], concurrency=15)
    with recording_tasks() as tasks:
        async with running(worker):
            loop = asyncio.get_running_loop()
            executor = loop._default_executor  # type: ignore[attr-defined]  # asyncio keeps it private
            assert executor._max_workers == 2 * 15 + 4  # above asyncio's own cap of 32
            name = await loop.run_in_executor(None, lambda: threading.current_thread().name)
            assert name.startswith("runfleet-run_")
            assert "reader" in tasks.names()
    assert not [r for r in caplog.records if r.msg == "stream.groups_unavailable"]


async def test_a_worker_whose_groups_cannot_be_created_starts_and_says_why(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = RedisConnectionError("redis is away")

    async def refuse(_self: Streams, _queues: object) -> None:
        raise down

    monkeypatch.setattr(Streams, "ensure_groups", refuse)
    caplog.set_level(logging.WARNING, logger="runfleet.worker.process")
    worker = Worker(settings, queues=["wired-a"], concurrency=1)
    async with running(worker):
        pass
    (record,) = [r for r in caplog.records if r.getMessage() == "stream.groups_unavailable"]
    assert record.levelno == logging.WARNING
    assert record.error == repr(down)  # type: ignore[attr-defined]  # a log ``extra`` field


async def test_run_returns_only_once_every_service_has_ended(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The services run in the worker's TaskGroup: a stop waits for each to finish its
    last pass before the pools close under it."""
    ended: list[str] = []

    async def slow_to_end(self: QueueGauges) -> None:
        await self._stopping.wait()
        await asyncio.sleep(1.5)  # a last pass, longer than the worker's own close
        ended.append(self.name)

    monkeypatch.setattr(QueueGauges, "_serve", slow_to_end)
    worker = Worker(settings, queues=["wired-a"], concurrency=1)
    async with running(worker):
        worker.stop()
    assert ended == [QueueGauges.name]


async def test_a_burst_worker_with_nothing_to_run_stops_on_its_own(settings: Settings) -> None:
    worker = Worker(settings, queues=["wired-a"], concurrency=1, burst=True)
    with recording_tasks() as tasks:
        run = asyncio.create_task(worker.run())
        try:
            await asyncio.wait_for(asyncio.shield(run), 10)
        finally:
            if not run.done():
                worker.stop(hard=True)
                await asyncio.wait_for(run, 15)
    assert worker.exit_code == 0
    assert {"burst", "reader"} <= tasks.names()
