"""The workers' retention loop: with ``RUNFLEET_RETENTION`` set, settled runs age out.

Every ``interval`` one worker of the fleet (the one that wins a session advisory lock
for the pass) deletes runs settled longer ago than the retention, in the bounded
batches of ``store.retention`` — each batch one short statement that skips rows other
transactions hold, so a worker's claim or settlement never waits on pruning longer
than one batch. It also drops stream consumers of dead worker processes (every process
start is a new consumer; nothing else ever removes them).

A failing pass is logged and counted, and tried again next interval: retention is
housekeeping, it never stops a worker. Unset retention means the loop does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence

from broker.streams import Streams
from store import Store
from store.config import Settings
from store.retention import DEFAULT_BATCH, START, Cursor, Deleted, Pass, Retention
from worker import metrics

log = logging.getLogger("runfleet.worker.retention")

INTERVAL_S = 60.0
"""Seconds between passes: retention is measured in days, a minute late is nothing."""

MAX_BATCHES_PER_PASS = 200
"""A pass stops after this many batches (100,000 runs at the default batch) and the
next one continues from there, so one pass never runs for long after a stop."""

DEAD_CONSUMER_IDLE_MS = 3_600_000
"""A stream consumer with nothing pending that has not read for an hour is dropped.
A live worker reads every half second while it has a free slot; one busy for longer
than this simply gets its consumer re-created by Redis at its next read."""


class RetentionLoop:
    """``run(stop)`` until ``stop`` is set; ``tick()`` is one pass (tests call it)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        streams: Streams | None,
        queues: Sequence[str],
        *,
        interval: float = INTERVAL_S,
        batch: int = DEFAULT_BATCH,
        max_batches: int = MAX_BATCHES_PER_PASS,
        consumer_idle_ms: int = DEAD_CONSUMER_IDLE_MS,
    ) -> None:
        self._retention = Retention(store.db)
        self._settings = settings
        self._streams = streams
        self._queues = list(queues)
        self._interval = interval
        self._batch = batch
        self._max_batches = max_batches
        self._consumer_idle_ms = consumer_idle_ms
        self._cursor: Cursor = START
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Prune every interval (jittered) until ``stop``; returns at once when unset."""
        if self._settings.retention_ms is None:
            return
        self._stop = stop
        while not stop.is_set():
            await self.tick()
            try:
                await asyncio.wait_for(
                    stop.wait(), timeout=self._interval * random.uniform(0.8, 1.2)
                )
            except TimeoutError:
                pass

    async def tick(self) -> Pass | None:
        """One pass if this process wins the fleet's lock; None if it did not (or failed)."""
        older_than = self._settings.retention_ms
        if older_than is None:
            return None
        started = time.monotonic()
        try:
            async with self._retention.exclusive() as mine:
                if not mine:
                    return None
                before_ms, now_ms = await self._retention.cutoff(older_than)
                done = await self._retention.prune(
                    before_ms,
                    now_ms,
                    batch=self._batch,
                    after=self._cursor,
                    max_batches=self._max_batches,
                    should_stop=self._stop.is_set,
                )
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("retention").inc()
            log.warning("retention.failed", extra={"error": repr(exc)}, exc_info=True)
            return None
        self._cursor = done.next
        _count(done.deleted)
        metrics.RETENTION_LONGEST_BATCH.observe(done.longest_batch_s)
        consumers = await self._prune_consumers()
        fields = {
            "runs": done.deleted.runs,
            "rows": done.deleted.rows,
            "batches": done.batches,
            "longest_batch_s": round(done.longest_batch_s, 4),
            "consumers": consumers,
            "complete": done.complete,
            "seconds": round(time.monotonic() - started, 3),
        }
        if done.deleted.runs or consumers:
            log.info("retention.pruned", extra=fields)
        else:  # an idle pass every minute is not worth an info line
            log.debug("retention.pruned", extra=fields)
        return done

    async def _prune_consumers(self) -> int:
        if self._streams is None or not self._queues:
            return 0
        try:
            removed = await self._streams.prune_consumers(self._queues, self._consumer_idle_ms)
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("retention").inc()
            log.warning("retention.consumers_failed", extra={"error": repr(exc)})
            return 0
        metrics.RETENTION_CONSUMERS_PRUNED.inc(removed)
        return removed


def _count(deleted: Deleted) -> None:
    for table, rows in (
        ("runs", deleted.runs),
        ("journal", deleted.journal),
        ("steps", deleted.steps),
        ("attempts", deleted.attempts),
        ("deferreds", deleted.deferreds),
        ("clocks", deleted.clocks),
        ("run_parents", deleted.edges),
    ):
        if rows:
            metrics.RETENTION_DELETED.labels(table).inc(rows)
