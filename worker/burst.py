"""rq's burst mode: ``Worker(burst=True)`` / ``runfleet worker --burst`` drains, then exits.

The worker stops (gracefully: what it holds finishes) once, twice in a row, it holds no
run and its queues hold nothing it could run now or within ``HORIZON_MS``: no run that is
pending (not waiting on a later timer), running or waking soon, and no dependent whose
dependencies are met (store/registries.py ``work_left``). A job scheduled for later, or a
dependent of an unfinished job, does not keep it alive (rq's burst leaves those too).
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


async def stop_when_drained(worker: Worker) -> None:
    registries = Registries(worker.store)
    quiet = 0
    while quiet < QUIET_CHECKS:
        await asyncio.sleep(CHECK_INTERVAL_S)
        assert worker.driver is not None
        if worker.driver.owned:
            quiet = 0
            continue
        try:
            left = await registries.work_left(worker.queues, HORIZON_MS)
        except INFRA_ERRORS as exc:
            log.warning("burst.check_failed", extra={"error": repr(exc)})
            quiet = 0
            continue
        quiet = 0 if left else quiet + 1
    log.info("worker.burst_drained", extra={"queues": worker.queues})
    worker.stop()
