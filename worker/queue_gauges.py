"""The limits of the queues a worker serves, as Prometheus gauges (docs/how-to/queues.md).

Every 5 s, per served queue with settings: its limits, its slots in use fleet-wide, how
many of its keys execute or wait, and how long its rate makes the next start wait. A
metric only: an error is counted and logged, and the loop goes on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import runfleet.worker.metrics as metrics
from runfleet.runtime.service import Service
from runfleet.store import Store

log = logging.getLogger("runfleet.worker.queue_gauges")

INTERVAL_S = 5.0
KEYS_READ = 100


class QueueGauges(Service):
    name = "queue-gauges"

    def __init__(self, store: Store, queues: Sequence[str]) -> None:
        super().__init__()
        self._store = store
        self._queues = list(queues)

    async def _serve(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                metrics.INFRA_ERRORS.labels("queue-gauges").inc()
                log.debug("queue_gauges.failed", extra={"error": repr(exc)})
            if await self._pause(INTERVAL_S):
                return

    async def refresh(self) -> None:
        queues = self._store.queues
        configured = [q for q in await queues.all() if q.name in self._queues]
        running = await queues.running([q.name for q in configured])
        for q in configured:
            limits = {
                "concurrency": q.concurrency,
                "rate_per_s": q.rate_per_s,
                "key_concurrency": q.key_concurrency,
                "key_rate_per_s": q.key_rate_per_s,
            }
            for limit, value in limits.items():
                metrics.QUEUE_LIMIT.labels(q.name, limit).set(value or 0)
            metrics.QUEUE_SLOTS_IN_USE.labels(q.name).set(running[q.name])
            wait = await queues.wait_ms(q.name)
            metrics.QUEUE_RATE_WAIT.labels(q.name).set((wait or 0) / 1000)
            if q.keyed:
                keys = await queues.keys(q.name, limit=KEYS_READ)
                metrics.QUEUE_KEYS.labels(q.name, "running").set(sum(k.running > 0 for k in keys))
                metrics.QUEUE_KEYS.labels(q.name, "waiting").set(sum(k.waiting > 0 for k in keys))
