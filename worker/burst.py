"""rq's burst mode: ``Worker(burst=True)`` / ``runfleet worker --burst`` drains, then exits.

The worker stops (gracefully: what it holds finishes) once, twice in a row, it holds no
run and its queues hold nothing it could run now or within ``HORIZON_MS``: no run that is
pending (not waiting on a later timer), running or waking soon, and no dependent whose
dependencies are met (store/registries.py ``work_left``). A job scheduled for later, or a
dependent of an unfinished job, does not keep it alive (rq's burst leaves those too).

A run this worker cannot execute (its flow is unknown here, its module fails to import,
its version or instance is not carried: ``worker.unrunnable``) does not keep it alive
either: it is left pending for a worker that can, named in one ``run.left_behind`` line
each, and the process exits with ``EXIT_LEFT_BEHIND`` instead of 0, so a CI job or a cron
entry sees that its queue was not emptied. A stop signal ends the wait at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from runfleet.store.registries import Registries
from runfleet.worker.retry import INFRA_ERRORS

if TYPE_CHECKING:
    from runfleet.worker.process import Worker

log = logging.getLogger("runfleet.worker.burst")

CHECK_INTERVAL_S = 0.2
HORIZON_MS = 1000
"""A timer due this soon still counts as work (a retry interval, a dependency re-look)."""
QUIET_CHECKS = 2
LINES_KEPT = 100
"""``run.left_behind`` lines at most; one more line counts the rest."""

EXIT_DRAINED = 0
"""Drained (or stopped by a signal): nothing this worker cannot execute was left behind."""
EXIT_LEFT_BEHIND = 3
"""Drained, but runs it cannot execute are still in its queues (``run.left_behind``)."""


async def stop_when_drained(worker: Worker, stopping: asyncio.Event) -> None:
    """Stop ``worker`` once drained (recording what it leaves behind); return on a stop."""
    assert worker.driver is not None
    decider = worker.driver.decider
    registries = Registries(worker.store)
    quiet = 0
    while quiet < QUIET_CHECKS:
        try:
            await asyncio.wait_for(stopping.wait(), CHECK_INTERVAL_S)
            return  # stopped by a signal (or the worker itself): nothing to wait for
        except TimeoutError:
            pass
        if worker.driver.owned:
            quiet = 0
            continue
        try:
            runnable = False
            async for run_id in registries.work_left(
                worker.queues, HORIZON_MS, excluding=decider.unrunnable.ids()
            ):
                row = await worker.store.runs.get(run_id)
                if row is not None and decider.cannot_run(row) is None:
                    runnable = True
                    break
        except INFRA_ERRORS as exc:
            log.warning("burst.check_failed", extra={"error": repr(exc)})
            quiet = 0
            continue
        quiet = 0 if runnable else quiet + 1
    try:
        worker.left_behind = await left_behind(worker)
    except INFRA_ERRORS as exc:
        log.warning("burst.check_failed", extra={"error": repr(exc)})
    log.info(
        "worker.burst_drained",
        extra={"queues": worker.queues, "left_behind": len(worker.left_behind)},
    )
    worker.stop()


async def left_behind(worker: Worker) -> dict[str, str]:
    """The runs of its queues this worker found it cannot execute and that are still
    unsettled, each with why; one ``run.left_behind`` line each (up to ``LINES_KEPT``)."""
    assert worker.driver is not None
    unrunnable = worker.driver.decider.unrunnable
    left: dict[str, str] = {}
    for row in await worker.store.runs.get_many(unrunnable.ids()):
        why = unrunnable.why(row.id)
        if why is None or row.status.terminal or row.queue not in worker.queues:
            continue
        left[row.id] = why
        if len(left) <= LINES_KEPT:
            log.warning(
                "run.left_behind",
                extra={"run_id": row.id, "flow": row.flow, "queue": row.queue, "why": why},
            )
    if len(left) > LINES_KEPT:
        log.warning("run.left_behind_more", extra={"runs": len(left) - LINES_KEPT})
    return left
