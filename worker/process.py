"""One worker process: stream reader, drives, lease, sweeps and cancel delivery.

Side tasks run under one TaskGroup: if any dies unexpectedly the worker stops
loudly instead of limping on. Shutdown (DESIGN §10): stop reading, give running
runs the grace period, then release what is left so another worker resumes it at
once; a hard stop releases immediately.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from redis.exceptions import RedisError

from broker.client import connect
from broker.codec import message_for
from broker.liveness import Liveness
from broker.notify import Notifier
from broker.streams import Delivery, Lane, Streams, lane_for
from store import Store
from store.config import Settings
from store.types import Owner, RunRow, RunStatus
from worker import metrics
from worker.batching import Coalesce
from worker.coordinator import Coordinator
from worker.driver import Driver
from worker.lease import Lease, LeaseGate
from worker.retention import RetentionLoop
from worker.retry import INFRA_ERRORS
from worker.scheduler import Scheduler, register_schedules
from worker.sweeper import Sweeper
from worker.watchdog import Watchdog

log = logging.getLogger("runfleet.worker.process")
BROKER_ERRORS: tuple[type[BaseException], ...] = (*INFRA_ERRORS, RedisError)
"""What a Redis call may raise that the worker survives: besides connection trouble, any
error *reply* (WRONGTYPE on a stream key, NOPERM, OOM, READONLY) — Redis only hints, so a
hint that fails is logged and the sweeps cover for it; it never stops the worker."""
LAG_INTERVAL_S = 5.0


def lane_of(row: RunRow) -> Lane:
    """The lane a run's wake goes to (``broker.streams.lane_for``)."""
    return lane_for(row.epoch)


def import_flows(modules: Sequence[str]) -> None:
    """Import the modules whose ``@flow`` decorators register this worker's flows."""
    for name in modules:
        importlib.import_module(name)


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        owner: Owner | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.owner = owner or Owner.for_this_process(settings.host_id)
        self._stopping = asyncio.Event()
        self._hard = asyncio.Event()
        self._side_stop = asyncio.Event()
        self.started = asyncio.Event()
        self.driver: Driver | None = None
        self._gate = LeaseGate(settings)

    # ---- service surface -----------------------------------------------------

    def stop(self, *, hard: bool = False) -> None:
        """First call: graceful stop. A second call (or ``hard``): release now. Idempotent."""
        if self._stopping.is_set() or hard:
            self._hard.set()
        self._stopping.set()

    def _may_claim(self) -> bool:
        """False while the lease is lapsed: a lapsed process reads and claims nothing."""
        return self._gate.open()

    async def run(self) -> None:
        # Sync flow bodies hold a thread for their whole run and each sync step needs
        # one more; asyncio's default pool (cpus + 4) would starve a busy worker.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(
                max_workers=2 * self.concurrency + 4, thread_name_prefix="runfleet-run"
            )
        )
        store = await Store.open(
            self.settings, source_id=self.owner.key, max_size=max(4, self.settings.pool_max)
        )
        redis = connect(self.settings, client_name=f"runfleet:{self.owner.key}")
        prefix = self.settings.redis_prefix
        self.streams = Streams(redis, prefix)
        self.notifier = Notifier(redis, prefix)
        # Redis hints of one event-loop turn share a pipeline: acks of the deliveries
        # decided, settled announcements, wake hints (each covered by a sweep if lost).
        self._acks: Coalesce[Delivery] = Coalesce(self._ack_many, name="acks")
        self._announcements: Coalesce[tuple[str, str]] = Coalesce(
            self.notifier.publish_settled_many, name="settled"
        )
        self._hints: Coalesce[RunRow] = Coalesce(self._publish_hints, name="hints")
        self.liveness = Liveness.for_settings(redis, self.settings)
        self.store = store
        # The lease renews on its own small pool: a renewal never waits behind the
        # shared pool's connections, nor behind a statement hung on one of them.
        # Its statements time out server-side after one interval, so a renewal stuck
        # on a row lock frees its connection for the next one.
        lease_store = await Store.open(
            self.settings,
            source_id=f"{self.owner.key}/lease",
            min_size=1,
            max_size=2,
            statement_timeout_ms=max(1, int(self.settings.renew_timeout * 1000)),
        )
        gate = self._gate
        driver = Driver(
            store,
            self.owner,
            self.settings,
            probe=self.liveness.probe,
            on_settled=self._settled,
            schedule=self._schedule,
            lease_ok=gate.open,
        )
        self.driver = driver
        self.coordinator = Coordinator(driver)
        lease = Lease(
            lease_store,
            driver,
            self.owner,
            self.settings,
            gate=gate,
            refresh_liveness=self._refresh,
        )
        self.lease = lease
        watchdog = Watchdog(
            confirmed_sent=lambda: gate.confirmed_sent,
            executing=driver.running_user_code,
            failstop_after=self.settings.failstop_after,
            confirm=self.settings.failstop_confirm,
        )
        sweeper = Sweeper(store, self.settings, self._dispatch)
        scheduler = Scheduler(store, self.settings, self.streams)
        retention = RetentionLoop(store, self.settings, self.streams, self.queues)
        self._started_ms = int(time.time() * 1000)
        try:
            try:
                await self.streams.ensure_groups(self.queues)
            except BROKER_ERRORS as exc:
                log.warning("stream.groups_unavailable", extra={"error": repr(exc)})
            await lease.tick()
            watchdog.start()
            await self._register_flows()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(lease.run(self._side_stop), name="lease")
                tg.create_task(sweeper.run(self._side_stop), name="sweeper")
                tg.create_task(scheduler.run(self._side_stop), name="scheduler")
                tg.create_task(retention.run(self._side_stop), name="retention")
                tg.create_task(self._lag_loop(), name="stream-lag")
                listener = tg.create_task(self._cancel_listener(), name="cancel-listener")
                reader = tg.create_task(self._read_loop(), name="reader")
                self.started.set()
                log.info(
                    "worker.started",
                    extra={
                        "owner": self.owner.key,
                        "queues": self.queues,
                        "concurrency": self.concurrency,
                    },
                )
                await self._stopping.wait()
                await reader
                await self._drain()
                self._side_stop.set()
                listener.cancel()
        finally:
            watchdog.stop()
            await lease_store.close()
            await self._close(store, redis)

    async def _lag_loop(self) -> None:
        """Publish each queue's stream lag as a gauge: a metric only, so errors never stop it."""
        while not self._side_stop.is_set():
            for queue in self.queues:
                try:
                    metrics.STREAM_LAG.labels(queue).set(await self.streams.lag(queue))
                except Exception as exc:
                    metrics.INFRA_ERRORS.labels("stream-lag").inc()
                    log.debug("stream.lag_failed", extra={"queue": queue, "error": repr(exc)})
            await self._wait_any(self._side_stop, LAG_INTERVAL_S)

    async def _register_flows(self) -> None:
        """Tell producers which flow names exist (they refuse unknown names at enqueue)."""
        import inspect

        from worker.flows import registered

        for flow in registered().values():
            try:
                signature = str(inspect.signature(flow.fn))
            except (TypeError, ValueError):
                signature = None
            try:
                await self.store.steps.register_flow(flow.name, flow.queue, signature)
            except INFRA_ERRORS as exc:
                log.warning("flow.register_failed", extra={"flow": flow.name, "error": repr(exc)})
        await register_schedules(self.store, registered().values())

    async def _drain(self) -> None:
        grace = self.settings.grace_period
        join = asyncio.create_task(self.coordinator.join(timeout=None))
        hard = asyncio.create_task(self._hard.wait())
        await asyncio.wait({join, hard}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        hard.cancel()
        if not join.done():
            assert self.driver is not None
            left = list(self.driver.owned)
            log.info("worker.releasing", extra={"runs": len(left)})
            for run_id in left:
                self.driver.interrupt(run_id, "shutdown")
            await join

    async def _close(self, store: Store, redis: object) -> None:
        for pending in (self._acks, self._announcements, self._hints):
            try:  # what was decided and settled is acknowledged and announced first
                await asyncio.wait_for(pending.drain(), timeout=1.0)
            except Exception as exc:
                log.warning("worker.flush_failed", extra={"error": repr(exc)})
        try:
            await asyncio.wait_for(self.liveness.clear(self.owner), timeout=1.0)
        except Exception as exc:
            log.warning("liveness.clear_failed", extra={"error": repr(exc)})
        await store.close()
        await self.streams_close(redis)
        log.info("worker.stopped", extra={"owner": self.owner.key})

    @staticmethod
    async def streams_close(redis: object) -> None:
        close = getattr(redis, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                pass

    # ---- reading -------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read as many messages as there are free slots, recovery lanes first.

        The read script takes every queue's recovery lane before any normal lane and
        never more than ``free`` entries in total, so a takeover or a released run
        gets the next free slot of whichever worker frees one first, ahead of any
        backlog, and slots are never over-subscribed. A lapsed process reads nothing.
        """
        backoff = 0.1
        last_reclaim = time.monotonic()
        while not self._stopping.is_set():
            free = self.concurrency - self.coordinator.active()
            if free <= 0:
                self.coordinator.changed.clear()
                await self._wait_any(self.coordinator.changed, 0.5)
                continue
            if not self._may_claim():
                await self._wait_any(self._stopping, 0.1)
                continue
            try:
                deliveries = await self.streams.read(self.owner.key, self.queues, free, 500)
                if not self._may_claim():
                    # The lease lapsed while the read blocked: leave what was read
                    # unacknowledged (a reclaim or a sweep re-delivers it) and claim nothing.
                    continue
                if time.monotonic() - last_reclaim > self.settings.stale_after * 2:
                    last_reclaim = time.monotonic()
                    deliveries += await self.streams.reclaim(
                        self.owner.key,
                        self.queues,
                        self.settings.stale_after_ms * 3,
                        max(0, free - len(deliveries)),
                    )
                backoff = 0.1
            except BROKER_ERRORS as exc:
                metrics.INFRA_ERRORS.labels("stream").inc()
                log.warning("stream.read_failed", extra={"error": repr(exc), "retry_in": backoff})
                await self._wait_any(self._stopping, backoff)
                backoff = min(backoff * 2, 5.0)
                await self._regroup()
                continue
            self.coordinator.schedule_many(
                [(delivery.message.run, self._acker(delivery)) for delivery in deliveries]
            )

    async def _regroup(self) -> None:
        try:
            await self.streams.ensure_groups(self.queues)
        except BROKER_ERRORS:
            pass

    def _acker(self, delivery: Delivery) -> Callable[[], None]:
        return lambda: self._acks.add(delivery)

    async def _ack_many(self, deliveries: list[Delivery]) -> None:
        """Acknowledge every delivery decided in one event-loop turn: one pipeline."""
        try:
            await self.streams.ack_many(deliveries)
        except BROKER_ERRORS as exc:
            log.warning("stream.ack_failed", extra={"runs": len(deliveries), "error": repr(exc)})

    @staticmethod
    async def _wait_any(event: asyncio.Event, timeout: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), timeout=timeout)
        except TimeoutError:
            pass

    # ---- fast paths ----------------------------------------------------------

    async def _dispatch(self, run_ids: list[str], reason: str) -> None:
        """Get runs driven: a wake on their queue's stream, or a local drive without Redis.

        A cancel request on a run nobody executes (pending or parked) is closed here:
        that needs no handler and no reader of its queue (DESIGN §7.1, §7.4), and a
        wake on a queue no worker reads would leave it pending forever.
        """
        rows = await self.store.runs.get_many(run_ids)
        closing = {
            row.id
            for row in rows
            if row.cancel_requested_at_ms is not None
            and row.status in (RunStatus.PENDING, RunStatus.SUSPENDED)
        }
        for run_id in closing:
            self.coordinator.schedule(run_id)
        rows = [row for row in rows if row.id not in closing]
        if not rows:
            return
        rows.sort(key=lambda row: lane_of(row) is not Lane.RECOVERY)  # recovered runs first
        try:
            for lane in Lane:
                await self.streams.publish_many(
                    [
                        (row.queue, message_for(row.id, row.flow, reason))
                        for row in rows
                        if lane_of(row) is lane
                    ],
                    lane,
                )
            return
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})
        free = self.concurrency - self.coordinator.active()
        for row in rows:
            if free <= 0:
                break
            if row.queue in self.queues and self.coordinator.schedule(row.id):
                free -= 1

    async def _schedule(self, row: RunRow) -> None:
        """Hint that a run can move (released, a child admitted, a parent woken).

        A run that already started (released, woken) goes to the recovery lane, so it
        resumes on the next free slot instead of behind the queue's backlog. Hints of
        one event-loop turn share one pipeline (``_publish_hints``).
        """
        self._hints.add(row)

    async def _publish_hints(self, rows: list[RunRow]) -> None:
        try:
            for lane in Lane:
                await self.streams.publish_many(
                    [
                        (row.queue, message_for(row.id, row.flow, "schedule"))
                        for row in rows
                        if lane_of(row) is lane
                    ],
                    lane,
                )
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})

    async def _settled(self, run_id: str, status: str) -> None:
        """Announce a committed settlement; one pipeline per event-loop turn."""
        self._announcements.add((run_id, status))

    async def _refresh(self, confirmed_ms: int, lapsed: bool, runs: int) -> None:
        await self.liveness.refresh(
            self.owner,
            confirmed_ms,
            lapsed,
            ttl_s=self.settings.liveness_ttl,
            info={"started_ms": self._started_ms, "queues": ",".join(self.queues), "runs": runs},
        )

    async def _cancel_listener(self) -> None:
        """Act on cancel publishes in milliseconds; the heartbeat poll is the backstop."""
        async for notice in self.notifier.listen("cancel"):
            if self._side_stop.is_set():
                return
            assert self.driver is not None
            if notice.run_id not in self.driver.owned:
                continue
            try:
                row = await self.store.runs.get(notice.run_id)
            except INFRA_ERRORS as exc:
                # This task lives in the worker's TaskGroup: a database outage here must
                # not stop the worker. The heartbeat poll delivers the cancel instead.
                metrics.INFRA_ERRORS.labels("cancel-listener").inc()
                log.warning(
                    "cancel.check_failed", extra={"run_id": notice.run_id, "error": repr(exc)}
                )
                continue
            if row is not None and row.cancel_requested_at_ms is not None:
                self.driver.interrupt(notice.run_id, "cancelled")
