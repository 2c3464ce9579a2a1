"""How runs reach this worker's drives: stream reads, reclaims, and the sweeps' finds.

The reader takes as many deliveries as there are free slots, recovery lanes first, and
hands each read to the coordinator as one batch (one row read and one claim statement).
The sweeps' finds go out as stream wakes like any other, so the fleet shares them; a
cancel request on a run nobody executes is closed here, without Redis or a reader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import runfleet.worker.metrics as metrics
from runfleet.broker.streams import Delivery, Lane, Streams
from runfleet.broker.wake_reasons import WakeReason
from runfleet.runtime.service import cancel_requested
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner, RunRow, RunStatus
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.outbox import BROKER_ERRORS, Outbox, lane_of, publish_checked_wakes

log = logging.getLogger("runfleet.worker.intake")

PEEKED_KEPT = 4096
"""How many doorbell entries this process remembers having driven: the group's own copy
of each is acknowledged without a second drive when it reaches this process (another
process's copy is a duplicate its claim loses). An entry forgotten costs one drive."""

EntryKey = tuple[str, Lane, str]


async def wait_any(event: asyncio.Event, timeout: float) -> None:
    """Wait for ``event`` at most ``timeout`` seconds."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
    except TimeoutError:
        pass


class Intake:
    def __init__(
        self,
        *,
        store: Store,
        streams: Streams,
        outbox: Outbox,
        coordinator: Coordinator,
        settings: Settings,
        owner: Owner,
        queues: Sequence[str],
        concurrency: int,
        may_claim: Callable[[], bool],
        untrusted: Callable[[str], bool] = lambda queue: False,
    ) -> None:
        self._store = store
        self._streams = streams
        self._outbox = outbox
        self._coordinator = coordinator
        self._settings = settings
        self._owner = owner
        self._queues = list(queues)
        self._concurrency = concurrency
        self._may_claim = may_claim
        self._untrusted = untrusted
        """Whether a queue's lane was lately found stranded (``WakeMarks.untrusted``)."""
        self._peeked: OrderedDict[EntryKey, None] = OrderedDict()

    def free(self) -> int:
        return self._concurrency - self._coordinator.active()

    async def read_loop(self, stopping: asyncio.Event) -> None:
        """Read as many messages as there are free slots, recovery lanes first.

        The read script takes every queue's recovery lane before any normal lane and
        never more than ``free`` entries in total, so a takeover or a released run
        gets the next free slot of whichever worker frees one first, ahead of any
        backlog, and slots are never over-subscribed. A lapsed process reads nothing;
        a stopping one hands back what its last read brought.
        """
        backoff = 0.1
        last_reclaim = time.monotonic()
        coordinator, streams, settings = self._coordinator, self._streams, self._settings
        while not stopping.is_set() and not cancel_requested():  # a lost cancel: service.py
            free = self.free()
            if free <= 0:
                coordinator.changed.clear()
                await wait_any(coordinator.changed, 0.5)
                continue
            if not self._may_claim():
                await wait_any(stopping, 0.1)
                continue
            try:
                deliveries = await streams.read(
                    self._owner.key, self._queues, free, 500, peek=settings.idle_peek
                )
                if not self._may_claim():
                    # The lease lapsed while the read blocked: leave what was read
                    # unacknowledged (a reclaim or a sweep re-delivers it) and claim nothing.
                    continue
                if time.monotonic() - last_reclaim > settings.stream_reclaim_every:
                    last_reclaim = time.monotonic()
                    deliveries += await streams.reclaim(
                        self._owner.key,
                        self._queues,
                        settings.stream_reclaim_idle_ms,
                        max(0, free - len(deliveries)),
                    )
                backoff = 0.1
            except BROKER_ERRORS as exc:
                metrics.INFRA_ERRORS.labels("stream").inc()
                log.warning("stream.read_failed", extra={"error": repr(exc), "retry_in": backoff})
                await wait_any(stopping, backoff)
                backoff = min(backoff * 2, 5.0)
                await self._regroup()
                continue
            if stopping.is_set():
                # The stop began while the read blocked: claim none of it, and give the
                # wakes back to the fleet at once (not after a reclaim's idle time).
                await self._hand_back([d for d in deliveries if not d.peeked])
                return
            fresh = self._fresh(deliveries)
            for d in fresh:
                if d.peeked:
                    coordinator.drive(d.message.run, None, d.message.flow, peeked=True)
            coordinator.drive_many(
                [(d.message.run, self._acker(d), d.message.flow) for d in fresh if not d.peeked]
            )

    def _fresh(self, deliveries: list[Delivery]) -> list[Delivery]:
        """What a read brought that this process has not driven yet.

        A doorbell's entry (``peeked``: the group still holds it) is remembered as driven;
        the group's copy of an entry this process already drove from its doorbell is
        acknowledged here, without a second drive: that wake was acted on (a peeked drive
        decides what an acknowledged one would, and a failed decision is the same lost
        wake as an acknowledged one whose drive failed: the lost-wake sweep's).
        """
        fresh: list[Delivery] = []
        for d in deliveries:
            key = (d.queue, d.lane, d.entry_id)
            if d.peeked:
                self._peeked[key] = None
                if len(self._peeked) > PEEKED_KEPT:
                    self._peeked.popitem(last=False)
                fresh.append(d)
            elif key in self._peeked:
                del self._peeked[key]
                self._outbox.ack(d)
            else:
                fresh.append(d)
        return fresh

    async def _hand_back(self, deliveries: list[Delivery]) -> None:
        """Put what a stopping worker read back on its streams, then acknowledge it.

        If Redis refuses, the deliveries stay unacknowledged: a reclaim by another
        consumer, or a sweep, delivers them again.
        """
        if not deliveries:
            return
        try:
            for lane in Lane:
                await self._streams.publish_many(
                    [(d.queue, d.message) for d in deliveries if d.lane is lane], lane
                )
            await self._streams.ack_many(deliveries)
        except BROKER_ERRORS as exc:
            log.warning(
                "stream.hand_back_failed", extra={"runs": len(deliveries), "error": repr(exc)}
            )

    def _acker(self, delivery: Delivery) -> Callable[[], None]:
        """Acknowledge ``delivery`` once its drive has decided (``Outbox``: pipelined)."""
        return lambda: self._outbox.ack(delivery)

    async def _regroup(self) -> None:
        try:
            await self._streams.ensure_groups(self._queues)
        except BROKER_ERRORS:
            pass

    async def dispatch(self, run_ids: list[str], reason: WakeReason) -> set[str]:
        """Get runs a sweep found driven: a wake on their queue's stream, or a local drive
        without Redis or where the stream's group will not deliver the wake. Returns the
        ids dispatched (the sweep's cursor moves past those only): a wake published that
        the group will deliver, a drive started here or already under way, or nothing left
        to do (the row is gone). A stopping worker drives nothing.

        A cancel request on a run nobody executes (pending or parked) is closed here,
        without a reader (DESIGN §7.1, §7.4): a wake on a queue no worker reads would
        leave it pending forever. Only where this process may claim it: any pending run
        (closing one executes nothing), a parked one only of a queue served here (its
        compensations are its own pool's code); the others get a wake on their queue.
        """
        rows = await self._store.runs.get_many(run_ids)
        found = {row.id for row in rows}
        dispatched = {run_id for run_id in run_ids if run_id not in found}
        closing = {
            row.id
            for row in rows
            if row.cancel_requested_at_ms is not None
            and row.status in (RunStatus.PENDING, RunStatus.SUSPENDED)
            and self._store.runs.may_claim(row)
        }
        dispatched |= {run_id for run_id in closing if self._drive_here(run_id)}
        rows = [row for row in rows if row.id not in closing]
        # A queue whose lane was lately found stranded (its group set ahead): whoever did
        # it may hide this wake too, after any check. Its runs served here are driven
        # here, as slots allow.
        held = {row.id for row in rows if row.queue in self._queues and self._untrusted(row.queue)}
        if held:
            log.warning(
                "stream.untrusted",
                extra={
                    "runs": len(held),
                    "queues": sorted({row.queue for row in rows if row.id in held}),
                },
            )
            dispatched |= self._drive_free([row for row in rows if row.id in held])
            rows = [row for row in rows if row.id not in held]
        if not rows:
            return dispatched
        rows.sort(key=lambda row: lane_of(row) is not Lane.RECOVERY)  # recovered runs first
        try:
            passed = await publish_checked_wakes(self._streams, rows, reason)
            dispatched |= {row.id for row in rows} - {row.id for row in passed}
            rows = passed
            if not rows:
                return dispatched
            # A wake the group will never deliver (its delivered id is past the entry's:
            # broker.stream_health) is no wake: drive here, or leave it to the next tick.
            log.warning(
                "stream.wake_undeliverable",
                extra={"runs": len(rows), "queues": sorted({row.queue for row in rows})},
            )
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})
        return dispatched | self._drive_free([row for row in rows if row.queue in self._queues])

    def _drive_free(self, rows: list[RunRow]) -> set[str]:
        """Drive ``rows`` here as far as free slots go; the ids whose drive started."""
        driven: set[str] = set()
        for row in rows:
            if self.free() <= 0:
                break
            if self._drive_here(row.id):
                driven.add(row.id)
        return driven

    def _drive_here(self, run_id: str) -> bool:
        """Drive ``run_id`` in this process; True if a drive of it started or is under way."""
        if self._coordinator.closed:
            return False
        self._coordinator.drive(run_id)
        return self._coordinator.driving(run_id)
