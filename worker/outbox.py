"""What a worker tells Redis: acknowledgements, wake hints, settled announcements.

Each is a hint Postgres stands behind (an unacknowledged delivery is reclaimed, a lost
wake is found by a sweep, a lost announcement costs a producer one poll), so none is
awaited by the drive that produced it and none may stop the worker. The ones of one
event-loop turn share one pipeline (``Coalesce``): a busy worker pays one round trip
per turn for what an idle one pays per run.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from runfleet.broker.codec import message_for
from runfleet.broker.gate import Gate
from runfleet.broker.notify import Notifier
from runfleet.broker.streams import Delivery, Lane, Streams, lane_for
from runfleet.broker.wake_reasons import WakeReason
from runfleet.runtime.batching import Coalesce
from runfleet.store.types import RunRow, RunStatus
from runfleet.worker.retry import INFRA_ERRORS

log = logging.getLogger("runfleet.worker.outbox")

BROKER_ERRORS: tuple[type[BaseException], ...] = (*INFRA_ERRORS, RedisError)
"""What a Redis call may raise that the worker survives: besides connection trouble, any
error *reply* (WRONGTYPE on a stream key, NOPERM, OOM, READONLY) — Redis only hints, so a
hint that fails is logged and the sweeps cover for it; it never stops the worker."""


def lane_of(row: RunRow) -> Lane:
    """The lane a run's wake goes to (``broker.streams.lane_for``)."""
    return lane_for(row.epoch)


async def publish_wakes(streams: Streams, rows: list[RunRow], reason: WakeReason) -> None:
    """One wake per run on its queue's stream, recovery lane for runs that already started
    (they resume ahead of the backlog); one pipeline per lane. Raises BROKER_ERRORS."""
    for lane in Lane:
        await streams.publish_many(
            [
                (row.queue, message_for(row.id, row.flow, reason))
                for row in rows
                if lane_of(row) is lane
            ],
            lane,
        )


async def publish_checked_wakes(
    streams: Streams, rows: list[RunRow], reason: WakeReason
) -> list[RunRow]:
    """``publish_wakes`` for a sweep's finds; returns the runs whose wake the group will not
    deliver (it delivered past the entry: ``Streams.publish_checked``). Raises
    BROKER_ERRORS."""
    passed: list[RunRow] = []
    for lane in Lane:
        laned = [row for row in rows if lane_of(row) is lane]
        if not laned:
            continue
        delivers = await streams.publish_checked(
            [(row.queue, message_for(row.id, row.flow, reason)) for row in laned], lane
        )
        passed.extend(row for row, ok in zip(laned, delivers, strict=True) if not ok)
    return passed


class Outbox:
    def __init__(self, streams: Streams, notifier: Notifier, gate: Gate | None = None) -> None:
        self._streams = streams
        self._gate = gate
        self._acks: Coalesce[Delivery] = Coalesce(self._ack_many, name="acks")
        self._announcements: Coalesce[tuple[str, RunStatus]] = Coalesce(
            notifier.publish_settled_many, name="settled"
        )
        self._wakes: Coalesce[RunRow] = Coalesce(self._publish_wakes, name="wakes")
        self._front_wakes: Coalesce[RunRow] = Coalesce(self._publish_front, name="front-wakes")
        self._gated: Coalesce[RunRow] = Coalesce(self._park_gated, name="gated")
        self._freed: Coalesce[str] = Coalesce(self._open_gates, name="freed-slots")
        self._started: Coalesce[RunRow] = Coalesce(self._unpark_started, name="ungated")

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivery whose drive has decided."""
        self._acks.add(delivery)

    async def hint(self, row: RunRow) -> None:
        """Hint that a run can move now (released, a child admitted, a parent woken)."""
        self._wakes.add(row)

    async def hint_front(self, row: RunRow) -> None:
        """Hint on the recovery lane, read before the backlog: a fresh run whose delivery a
        higher-priority run took (docs/how-to/queues.md) keeps its place at the head of the line."""
        self._front_wakes.add(row)

    async def gate(self, row: RunRow) -> None:
        """Park the wake of a run its queue's concurrency limit refused (``broker.gate``)."""
        self._gated.add(row)

    async def started(self, row: RunRow) -> None:
        """A run of a limited queue started here: a wake of it parked at the gate is stale."""
        self._started.add(row)

    def slot_freed(self, queue: str) -> None:
        """An execution of a limited queue ended here: one gated wake of it may move."""
        self._freed.add(queue)

    async def settled(self, run_id: str, status: RunStatus) -> None:
        """Announce a committed settlement to the producers waiting on it."""
        self._announcements.add((run_id, status))

    async def flush(self, timeout: float = 1.0) -> None:
        """Send what is pending (at shutdown: what was decided and settled goes out first)."""
        pendings = (
            self._acks,
            self._announcements,
            self._wakes,
            self._front_wakes,
            self._gated,
            self._started,
            self._freed,
        )
        for pending in pendings:
            try:
                await asyncio.wait_for(pending.drain(), timeout=timeout)
            except Exception as exc:
                log.warning("worker.flush_failed", extra={"error": repr(exc)})

    async def _ack_many(self, deliveries: list[Delivery]) -> None:
        try:
            await self._streams.ack_many(deliveries)
        except BROKER_ERRORS as exc:
            log.warning("stream.ack_failed", extra={"runs": len(deliveries), "error": repr(exc)})

    async def _park_gated(self, rows: list[RunRow]) -> None:
        if self._gate is None:
            return  # no gate: the lost-wake sweep schedules them again
        try:
            await self._gate.park((row.queue, row.id, row.flow) for row in rows)
        except BROKER_ERRORS as exc:
            log.warning("gate.park_failed", extra={"runs": len(rows), "error": repr(exc)})

    async def _unpark_started(self, rows: list[RunRow]) -> None:
        if self._gate is None:
            return
        try:
            await self._gate.unpark((row.queue, row.id, row.flow) for row in rows)
        except BROKER_ERRORS as exc:  # a stale entry costs one wasted slot offer
            log.warning("gate.unpark_failed", extra={"runs": len(rows), "error": repr(exc)})

    async def _open_gates(self, queues: list[str]) -> None:
        if self._gate is None:
            return
        try:
            await self._gate.open(queues)
        except BROKER_ERRORS as exc:
            log.warning("gate.open_failed", extra={"queues": len(queues), "error": repr(exc)})

    async def _publish_front(self, rows: list[RunRow]) -> None:
        messages = [
            (row.queue, message_for(row.id, row.flow, WakeReason.DISPLACED)) for row in rows
        ]
        try:
            await self._streams.publish_many(messages, Lane.RECOVERY)
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})

    async def _publish_wakes(self, rows: list[RunRow]) -> None:
        try:
            await publish_wakes(self._streams, rows, WakeReason.SCHEDULE)
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})
