"""The planner's statistics kept up with a young fleet's tables.

See docs/explanation/admission-path.md, "Plans that do not grow with the table".

A worker's connections prepare their statements while ``runs`` is young; Postgres plans a
table it believes to be one page as a sequential scan and keeps that plan until the
table's statistics change, which autovacuum does once a minute at best. Each sweep tick
this asks Postgres to ANALYZE a runfleet table whose committed rows at least doubled
since they were counted (``runfleet.analyze_grown``), which makes every connection plan it again.
A failing refresh is retried after a growing pause, not every tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import runfleet.worker.metrics as metrics
from runfleet.store import Store

log = logging.getLogger("runfleet.worker.statistics")

MAX_PAUSE = 60.0
"""The longest pause after failed refreshes (it doubles from 2 s with each failure)."""


class StatisticsRefresh:
    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._failures = 0
        self._paused_until = 0.0

    async def tick(self) -> None:
        """ANALYZE one grown table if any (one caller at a time, fleet-wide); log it."""
        if self._clock() < self._paused_until:
            return
        try:
            analyzed = await self._store.sweeps.analyze_grown()
        except Exception as exc:  # plans stay as they are until a later refresh
            self._failures += 1
            pause = min(MAX_PAUSE, 2.0**self._failures)
            self._paused_until = self._clock() + pause
            metrics.INFRA_ERRORS.labels("sweep:statistics").inc()
            log.warning("statistics.refresh_failed", extra={"error": repr(exc), "retry_in": pause})
            return
        self._failures = 0
        for table in analyzed:
            log.info(
                "statistics.refreshed",
                extra={
                    "table": table.table,
                    "rows_counted": table.rows_counted,
                    "rows_now": table.rows_now,
                },
            )
