"""One worker process: its collaborators, their services, and shutdown.

Everything the process runs is built in one place (``_assemble``) and every long-lived
part is a ``runtime.service.Service`` started in one TaskGroup: if any dies unexpectedly
the worker stops loudly instead of limping on. The reader lives in ``worker.intake``,
what the worker tells Redis in ``worker.outbox``. Shutdown (DESIGN §10): stop reading,
give running runs the grace period, then release what is left so another worker resumes
it at once; a hard stop releases immediately. From the moment a stop begins the worker
claims nothing by any path (``Driver.close``, ``Coordinator.close``): it only finishes or
hands back what it holds, so it always exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import runfleet.worker.metrics as metrics
import runfleet.worker.otel_metrics as otel_metrics
import runfleet.worker.tracing as tracing
from runfleet.broker.client import connect
from runfleet.broker.gate import Gate
from runfleet.broker.liveness import Liveness
from runfleet.broker.notify import Notice, Notifier
from runfleet.broker.stream_health import StreamHealth
from runfleet.broker.streams import Streams
from runfleet.runtime.service import Service
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from runfleet.worker.authoring.durable import Cause
from runfleet.worker.authoring.flows import registered
from runfleet.worker.burst import EXIT_DRAINED, EXIT_LEFT_BEHIND, stop_when_drained
from runfleet.worker.carried import advertised
from runfleet.worker.containment import contain_callbacks, contain_tasks
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.driver import Driver
from runfleet.worker.intake import Intake
from runfleet.worker.lease import Lease, LeaseGate
from runfleet.worker.outbox import Outbox
from runfleet.worker.queue_gauges import QueueGauges
from runfleet.worker.rate_pump import RatePump
from runfleet.worker.resolver import flow_modules, import_prefixes
from runfleet.worker.retention import RetentionLoop
from runfleet.worker.retry import INFRA_ERRORS
from runfleet.worker.scheduler import Scheduler, register_schedules
from runfleet.worker.sweeper import Sweeper
from runfleet.worker.wake_marks import WakeMarks
from runfleet.worker.watchdog import Watchdog

log = logging.getLogger("runfleet.worker.process")
LAG_INTERVAL_S = 5.0


class StreamLag(Service):
    """Publish each queue's stream lag as a gauge: a metric only, so errors never stop it."""

    name = "stream-lag"

    def __init__(self, streams: Streams, queues: Sequence[str]) -> None:
        super().__init__()
        self._streams = streams
        self._queues = list(queues)

    async def _serve(self) -> None:
        while True:
            for queue in self._queues:
                try:
                    metrics.STREAM_LAG.labels(queue).set(await self._streams.lag(queue))
                except Exception as exc:
                    metrics.INFRA_ERRORS.labels("stream-lag").inc()
                    log.debug("stream.lag_failed", extra={"queue": queue, "error": repr(exc)})
            if await self._pause(LAG_INTERVAL_S):
                return


@dataclass(frozen=True)
class QueueSlots:
    """The driver's ``Slots`` in a worker process: a freed slot opens one gated wake (the
    outbox), a rate's refusal pumps the queue's gate at its next token (the rate pump)."""

    outbox: Outbox
    pump: RatePump

    def slot_freed(self, queue: str) -> None:
        self.outbox.slot_freed(queue)

    def rate_due(self, queue: str, after_ms: int) -> None:
        self.pump.due(queue, after_ms)


class Worker:
    def __init__(
        self,
        settings: Settings,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        owner: Owner | None = None,
        burst: bool = False,
    ) -> None:
        """``burst``: rq's ``work(burst=True)`` / ``runfleet worker --burst``: stop (gracefully)
        once its queues hold nothing it could run now (worker/burst.py)."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.owner = owner or Owner.for_this_process(settings.host_id)
        self._stopping = asyncio.Event()
        self._hard = asyncio.Event()
        self.started = asyncio.Event()
        self.driver: Driver | None = None
        self._sweeper: Sweeper | None = None
        self._gate = LeaseGate(settings)
        self.burst = burst
        self.left_behind: dict[str, str] = {}
        """``burst``: the runs it drained without, as it cannot execute them, and why."""

    # ---- service surface -----------------------------------------------------

    @property
    def exit_code(self) -> int:
        """The process's exit status once ``run`` returned: 0, or ``--burst``'s
        ``EXIT_LEFT_BEHIND`` when it drained without runs it cannot execute."""
        return EXIT_LEFT_BEHIND if self.left_behind else EXIT_DRAINED

    def stop(self, *, hard: bool = False) -> None:
        """First call: graceful stop. A second call (or ``hard``): release now. Idempotent.

        Claims stop here, synchronously (a signal handler's call returns before any other
        task runs): a claim that would start a body after the stop is never made.
        """
        if self._stopping.is_set() or hard:
            self._hard.set()
        self._stopping.set()
        self._claim_nothing()

    def _claim_nothing(self) -> None:
        if self.driver is not None:
            self.driver.close()
            self.coordinator.close()
        if self._sweeper is not None:
            self._sweeper.stop()  # its finds would be handed to a worker that takes none

    async def run(self) -> None:
        # Sync flow bodies hold a thread for their whole run and each sync step needs
        # one more; asyncio's default pool (cpus + 4) would starve a busy worker.
        loop = asyncio.get_running_loop()
        loop.set_default_executor(
            ThreadPoolExecutor(
                max_workers=2 * self.concurrency + 4, thread_name_prefix="runfleet-run"
            )
        )
        contain_tasks(loop)  # a task a run body creates cannot end the process either
        contain_callbacks(loop)  # nor a callback it schedules on the loop
        services = await self._assemble()
        try:
            try:
                await self.streams.ensure_groups(self.queues)
            except Exception as exc:
                log.warning("stream.groups_unavailable", extra={"error": repr(exc)})
            await self.lease.tick()
            self.watchdog.start()
            await self._register_flows()
            async with asyncio.TaskGroup() as tg:
                for service in services:
                    service.start(tg)  # a service that crashes ends this group
                reader = tg.create_task(self.intake.read_loop(self._stopping), name="reader")
                if self.burst:
                    tg.create_task(stop_when_drained(self, self._stopping), name="burst")
                self.started.set()
                self._announce()
                await self._stopping.wait()
                await reader
                await self._drain()
                for service in services:
                    service.stop()
        finally:
            self.watchdog.stop()
            await self._close()

    def _announce(self) -> None:
        """The start line: what this process serves and what it may run (Celery's
        ``[tasks]``), so a worker started without its flows says so at once."""
        flows, modules, prefixes = sorted(registered()), flow_modules(), import_prefixes()
        log.info(
            "worker.started",
            extra={
                "owner": self.owner.key,
                "queues": self.queues,
                "concurrency": self.concurrency,
                "burst": self.burst,
                "flows": flows,
                "modules": modules,
                "allow_import": prefixes,
            },
        )
        if not (flows or modules or prefixes):
            log.warning(
                "worker.runs_nothing",
                extra={"hint": "pass --flows app.flows (or --allow-import app)"},
            )

    async def _assemble(self) -> list[Service]:
        """Build every collaborator of this process, once; the services to start."""
        settings, owner = self.settings, self.owner
        if settings.otel:  # RUNFLEET_OTEL: spans per activation, step, attempt, wait, child
            tracing.enable()
            otel_metrics.enable()  # and the metrics, through the application's meter provider
        # The store claims only runs of the queues this process serves (the row's queue
        # decides, whatever a stream message names: store.runs.Runs). No statement of
        # this process waits on a lock for longer than worker_lock_wait_ms: a tenant's
        # login may hold its own runs' rows (docs/explanation/trust-model.md); a row
        # write that meets one answers RowLocked and that run is set aside.
        self.store = await Store.open(
            settings,
            source_id=owner.key,
            max_size=max(4, settings.pool_max),
            lock_timeout_ms=settings.worker_lock_wait_ms,
            serves=self.queues,
        )
        # The lease renews on its own small pool: a renewal never waits behind the
        # shared pool's connections, nor behind a statement hung on one of them.
        # Its statements time out server-side after one interval, so a renewal stuck
        # on a row lock frees its connection for the next one.
        self._lease_store = await Store.open(
            settings,
            source_id=f"{owner.key}/lease",
            min_size=1,
            max_size=2,
            statement_timeout_ms=max(1, int(settings.renew_timeout * 1000)),
            lock_timeout_ms=settings.worker_lock_wait_ms,
            serves=self.queues,
        )
        self._redis = connect(settings, client_name=f"runfleet:{owner.key}")
        prefix = settings.redis_prefix
        self.streams = Streams(self._redis, prefix)
        self.notifier = Notifier(self._redis, prefix)
        self.liveness = Liveness.for_settings(self._redis, settings)
        queue_gate = Gate(self._redis, prefix, self.streams)
        self.outbox = Outbox(self.streams, self.notifier, queue_gate)
        self.rate_pump = RatePump(self.store, queue_gate)
        gate = self._gate
        self.driver = driver = Driver(
            self.store,
            owner,
            settings,
            probe=self.liveness.probe,
            hints=self.outbox,
            lease=gate,
            slots=QueueSlots(self.outbox, self.rate_pump),
        )
        self.coordinator = Coordinator(driver)
        marks = WakeMarks(
            self.store, self.streams, self.queues, settings, StreamHealth(self._redis)
        )
        self.intake = Intake(
            store=self.store,
            streams=self.streams,
            outbox=self.outbox,
            coordinator=self.coordinator,
            settings=settings,
            owner=owner,
            queues=self.queues,
            concurrency=self.concurrency,
            may_claim=gate.open,
            untrusted=marks.untrusted,
        )
        self.lease = Lease(
            self._lease_store,
            driver,
            owner,
            settings,
            gate=gate,
            refresh_liveness=self._refresh,
        )
        self.watchdog = Watchdog(
            confirmed_sent=lambda: gate.confirmed_sent,
            executing=driver.running_user_code,
            failstop_after=settings.failstop_after,
            confirm=settings.failstop_confirm,
        )
        self._started_ms = int(time.time() * 1000)
        self._advertised = advertised()  # the versions and instances it carries
        self._sweeper = Sweeper(
            self.store,
            settings,
            self.intake.dispatch,
            marks=marks,
        )
        if self._stopping.is_set():  # stopped while assembling
            self._claim_nothing()
        return [
            self.lease,
            self._sweeper,
            Scheduler(self.store, settings, self.streams),
            RetentionLoop(self.store, settings, self.streams, self.queues),
            self.notifier.subscription("cancel", self._on_cancel),
            StreamLag(self.streams, self.queues),
            QueueGauges(self.store, self.queues),
        ]

    async def _register_flows(self) -> None:
        """Tell producers which flow names exist (they refuse unknown names at enqueue)."""
        import inspect

        for flow in registered().values():
            try:
                found = inspect.signature(flow.fn)
                if flow.owner is not None:  # a class-bound flow: called on its instance
                    found = found.replace(parameters=list(found.parameters.values())[1:])
                signature = str(found)
            except (TypeError, ValueError):
                signature = None
            try:
                await self.store.flows.register(flow.name, flow.queue, signature)
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
                self.driver.interrupt(run_id, Cause.SHUTDOWN)
            await join

    async def _close(self) -> None:
        await self.rate_pump.close()
        await self.outbox.flush()  # what was decided and settled goes out first
        try:
            await asyncio.wait_for(self.liveness.clear(self.owner), timeout=1.0)
        except Exception as exc:
            log.warning("liveness.clear_failed", extra={"error": repr(exc)})
        await self._lease_store.close()
        await self.store.close()
        try:
            await self._redis.aclose()
        except Exception:
            pass
        log.info("worker.stopped", extra={"owner": self.owner.key})

    async def _refresh(self, confirmed_ms: int, lapsed: bool, runs: int) -> None:
        await self.liveness.refresh(
            self.owner,
            confirmed_ms,
            lapsed,
            ttl_s=self.settings.liveness_ttl,
            info={
                "started_ms": self._started_ms,
                "queues": ",".join(self.queues),
                "runs": runs,
                **self._advertised,
            },
        )

    async def _on_cancel(self, notice: Notice) -> None:
        """Act on a cancel publish in milliseconds; the heartbeat poll is the backstop."""
        assert self.driver is not None
        if notice.run_id not in self.driver.owned:
            return
        try:
            row = await self.store.runs.get(notice.run_id)
        except INFRA_ERRORS as exc:
            # A database outage here must not stop the worker: the heartbeat poll
            # delivers the cancel instead.
            metrics.INFRA_ERRORS.labels("cancel-listener").inc()
            log.warning("cancel.check_failed", extra={"run_id": notice.run_id, "error": repr(exc)})
            return
        if row is not None and row.cancel_requested_at_ms is not None:
            self.driver.interrupt(notice.run_id, Cause.CANCELLED)
