"""The workers' retention loop: runs' own TTLs expire them, ``RUNFLEET_RETENTION`` the rest.

Every ``interval`` one worker of the fleet (the one that wins a session advisory lock
for the pass) deletes runs whose own TTL has passed (rq's ``result_ttl`` /
``failure_ttl``) and, with ``RUNFLEET_RETENTION`` set, runs without one settled longer
ago than the retention, in the bounded batches of ``store.retention`` — each batch one
short statement that skips rows other transactions hold, so a worker's claim or
settlement never waits on pruning longer than one batch. With ``RUNFLEET_RETENTION`` set
it also drops stream consumers of dead worker processes (every process start is a new
consumer; nothing else ever removes them).

A failing pass is logged and counted, and tried again next interval: retention is
housekeeping, it never stops a worker. The TTL pass always runs, because any producer
may enqueue with a TTL: it walks an index that holds only runs with a TTL, so a fleet
that never uses them pays one empty index probe per interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import runfleet.worker.metrics as metrics
from runfleet.broker.streams import Streams
from runfleet.runtime.service import Service, Signal
from runfleet.store import Store
from runfleet.store.config import Settings, jittered
from runfleet.store.retention import (
    DEFAULT_BATCH,
    NO_CUTOFF,
    START,
    Cursor,
    Deleted,
    Pass,
    Retention,
    Scan,
)

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


@dataclass(frozen=True)
class RetentionSignals:
    """Points of the retention loop a test waits on instead of polling
    (``runtime.service.Signal``)."""

    passed: Signal[Pass | None] = field(default_factory=Signal)
    """One ``tick`` ended: what it returned."""
    expired: Signal[Pass] = field(default_factory=Signal)
    """A TTL pass ran (this process won the fleet's lock): what it deleted."""


class RetentionLoop(Service):
    """A service (``runtime.service``) pruning every ``interval``, jittered.

    ``tick()`` is one pass (tests call it directly).
    """

    name = "retention"

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
        signals: RetentionSignals | None = None,
    ) -> None:
        super().__init__()
        self._signals = signals
        self._retention = Retention(store.db)
        self._settings = settings
        self._streams = streams
        self._queues = list(queues)
        self._interval = interval
        self._batch = batch
        self._max_batches = max_batches
        self._consumer_idle_ms = consumer_idle_ms
        self._cursor: Cursor = START
        self._expiry_cursor: Cursor = START
        self.last_expiry: Pass | None = None
        """The TTL pass of the latest ``tick`` that won the lock (tests read it)."""

    async def _serve(self) -> None:
        """Prune every interval (jittered) until stopped."""
        while not self.stopping:
            await self.tick()
            await self._pause(jittered(self._interval))

    async def tick(self) -> Pass | None:
        """One pass if this process wins the fleet's lock: the TTL pass, then (with
        ``RUNFLEET_RETENTION``) the fleet pass, which is returned. None if the lock was
        elsewhere, the pass failed, or retention is unset (``last_expiry`` then tells).
        A pass that runs while the service stops ends after its current batch."""
        done = await self._pass()
        if self._signals is not None:
            self._signals.passed.fire(done)
        return done

    async def _pass(self) -> Pass | None:
        older_than = self._settings.retention_ms
        started = time.monotonic()
        done: Pass | None = None
        keys = 0
        try:
            async with self._retention.exclusive() as mine:
                if not mine:
                    return None
                before_ms, now_ms = await self._retention.cutoff(older_than or 0)
                if older_than is None:
                    before_ms = NO_CUTOFF
                expired = await self._retention.prune(
                    before_ms,
                    now_ms,
                    batch=self._batch,
                    scan=Scan.EXPIRY,
                    after=self._expiry_cursor,
                    max_batches=self._max_batches,
                    should_stop=self._stopping.is_set,
                )
                self._expiry_cursor = expired.next
                keys = await self._retention.prune_keys(
                    batch=self._batch, should_stop=self._stopping.is_set
                )
                self.last_expiry = expired
                if self._signals is not None:
                    self._signals.expired.fire(expired)
                if older_than is not None:
                    done = await self._retention.prune(
                        before_ms,
                        now_ms,
                        batch=self._batch,
                        after=self._cursor,
                        max_batches=self._max_batches,
                        should_stop=self._stopping.is_set,
                    )
                    self._cursor = done.next
        except Exception as exc:
            metrics.INFRA_ERRORS.labels("retention").inc()
            log.warning("retention.failed", extra={"error": repr(exc)}, exc_info=True)
            return None
        deleted = expired.deleted + (done.deleted if done else Deleted())
        longest = max(expired.longest_batch_s, done.longest_batch_s if done else 0.0)
        _count(deleted)
        metrics.RETENTION_LONGEST_BATCH.observe(longest)
        # Dead stream consumers are the fleet-wide housekeeping's, off with it.
        consumers = await self._prune_consumers() if older_than is not None else 0
        fields = {
            "runs": deleted.runs,
            "expired": expired.deleted.runs,
            "rows": deleted.rows,
            "batches": expired.batches + (done.batches if done else 0),
            "longest_batch_s": round(longest, 4),
            "consumers": consumers,
            "keys": keys,
            "complete": expired.complete and (done is None or done.complete),
            "seconds": round(time.monotonic() - started, 3),
        }
        if deleted.runs or consumers or keys:
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
