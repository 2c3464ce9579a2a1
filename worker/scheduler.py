"""The scheduler service: every worker fires due schedules; Postgres makes each tick fire once.

Every worker runs one, every ``interval`` (jittered). There is no leader: each pass
lists due schedules and fires each through ``store.schedules.Schedules.fire`` — one
transaction that locks the schedule row (rows another scheduler holds are skipped, not
waited for), admits the tick's run with the producers' own admission (``Runs.create``)
and moves ``next_tick_ms`` on by compare-and-set. A scheduler SIGKILLed mid-fire leaves
nothing half-done: its transaction rolls back and the next pass of any worker fires the
tick. Once committed, the new runs are woken the way a producer's are (one stream
message each on the normal lane, ``broker.codec.message_for``); if Redis refuses, the
lost-pending sweep schedules them, as for any admission.

Decorated flows (``@flow(schedule=...)``) get their schedule rows from
``register_schedules``, called by each worker at start next to the flow registry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import assert_never

import runfleet.worker.metrics as metrics
from runfleet.broker.codec import message_for
from runfleet.broker.streams import Streams
from runfleet.broker.wake_reasons import WakeReason
from runfleet.runtime.service import Service, Signal
from runfleet.store import Store
from runfleet.store.config import Settings, jittered
from runfleet.store.schedules import Fired, NotDue, Schedules
from runfleet.worker.authoring.flows import Flow
from runfleet.worker.retry import INFRA_ERRORS

log = logging.getLogger("runfleet.worker.scheduler")

BATCH = 32
"""Due schedules one pass fires at most; the most overdue first, the rest next pass."""


@dataclass(frozen=True)
class SchedulerSignals:
    """Points of the scheduler a test waits on instead of polling (``runtime.service.Signal``)."""

    passed: Signal[int] = field(default_factory=Signal)
    """One pass ended: the number of runs it admitted."""


class Scheduler(Service):
    """A service (``runtime.service``) passing every ``schedule_interval``, jittered.

    ``tick()`` is one pass (tests call it directly).
    """

    name = "scheduler"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        streams: Streams,
        *,
        signals: SchedulerSignals | None = None,
    ) -> None:
        super().__init__()
        self._schedules = Schedules.of(store)
        self._settings = settings
        self._streams = streams
        self._signals = signals

    async def _serve(self) -> None:
        interval = self._settings.schedule_interval
        while not self.stopping:
            await self.tick()
            await self._pause(jittered(interval))

    async def tick(self) -> int:
        """Fire every due schedule this pass can take; the number of runs admitted.

        A failure is logged and the pass goes on with the next schedule (its tick stays
        due: the failed transaction rolled back); it never stops the worker.
        Failures count in ``runfleet_infrastructure_errors_total{component="scheduler"}``.
        """
        admitted = await self._pass()
        if self._signals is not None:
            self._signals.passed.fire(admitted)
        return admitted

    async def _pass(self) -> int:
        try:
            names = await self._schedules.due(BATCH)
        except Exception as exc:  # in the worker's TaskGroup: never stop the worker
            metrics.INFRA_ERRORS.labels("scheduler").inc()
            log.warning("schedule.pass_failed", extra={"error": repr(exc)})
            return 0
        admitted = 0
        for name in names:
            try:
                outcome = await self._schedules.fire(
                    name, grace_ms=self._settings.schedule_grace_ms
                )
            except Exception as exc:
                metrics.INFRA_ERRORS.labels("scheduler").inc()
                log.warning("schedule.fire_failed", extra={"schedule": name, "error": repr(exc)})
                continue
            match outcome:
                case Fired():
                    admitted += len(outcome.admitted)
                    await self._wake(outcome)
                case NotDue():
                    pass
                case unreachable:
                    assert_never(unreachable)
        return admitted

    async def _wake(self, fired: Fired) -> None:
        for outcome, count in (
            ("admitted", len(fired.admitted)),
            ("joined", fired.joined),
            ("missed", fired.missed),
            ("overlapped", fired.overlapped),
        ):
            if count:
                metrics.SCHEDULE_TICKS.labels(outcome).inc(count)
        if fired.missed or fired.overlapped:
            # Missed ticks mean an outage (info); an overlap skip can recur every tick
            # for as long as a long run lasts (debug).
            skipped = {
                "schedule": fired.schedule.name,
                "missed": fired.missed,
                "overlapped": fired.overlapped,
            }
            if fired.missed:
                log.info("schedule.ticks_skipped", extra=skipped)
            else:
                log.debug("schedule.ticks_skipped", extra=skipped)
        for row in fired.admitted:
            log.debug(
                "schedule.admitted", extra={"schedule": fired.schedule.name, "run_id": row.id}
            )
        messages = [
            (row.queue, message_for(row.id, row.flow, WakeReason.SCHEDULE, "schedule"))
            for row in fired.admitted
        ]
        try:
            await self._streams.publish_many(messages)
        except Exception as exc:  # the lost-pending sweep schedules them
            log.warning("enqueue.publish_failed", extra={"runs": len(messages), "error": repr(exc)})


async def register_schedules(store: Store, flows: Iterable[Flow]) -> None:
    """Write the schedules of decorated flows (``@flow(schedule=...)``) at worker start.

    Every worker of a fleet does this at start; the upsert is idempotent and leaves an
    unchanged schedule alone, so workers agree and a schedule's next tick, counters and
    pause survive restarts and deploys. Infrastructure errors are logged, never fatal
    (the next start writes it again), like the flow registry's.
    """
    schedules = Schedules.of(store)
    for flow in flows:
        spec = flow.schedule
        if spec is None:
            continue
        try:
            changed = await schedules.upsert(spec)
        except INFRA_ERRORS as exc:
            log.warning(
                "schedule.register_failed", extra={"schedule": spec.name, "error": repr(exc)}
            )
            continue
        if changed is not None:
            log.info(
                "schedule.registered",
                extra={
                    "schedule": spec.name,
                    "cron": spec.cron.expression,
                    "timezone": spec.cron.timezone,
                    "next_tick_ms": changed.next_tick_ms,
                },
            )
