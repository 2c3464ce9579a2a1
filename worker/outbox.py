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

from runfleet.broker.batching import Coalesce
from runfleet.broker.codec import message_for
from runfleet.broker.notify import Notifier
from runfleet.broker.streams import Delivery, Lane, Streams, lane_for
from runfleet.store.types import RunRow
from runfleet.worker.retry import INFRA_ERRORS

log = logging.getLogger("runfleet.worker.outbox")

BROKER_ERRORS: tuple[type[BaseException], ...] = (*INFRA_ERRORS, RedisError)
"""What a Redis call may raise that the worker survives: besides connection trouble, any
error *reply* (WRONGTYPE on a stream key, NOPERM, OOM, READONLY) — Redis only hints, so a
hint that fails is logged and the sweeps cover for it; it never stops the worker."""


def lane_of(row: RunRow) -> Lane:
    """The lane a run's wake goes to (``broker.streams.lane_for``)."""
    return lane_for(row.epoch)


async def publish_wakes(streams: Streams, rows: list[RunRow], reason: str) -> None:
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


class Outbox:
    def __init__(self, streams: Streams, notifier: Notifier) -> None:
        self._streams = streams
        self._acks: Coalesce[Delivery] = Coalesce(self._ack_many, name="acks")
        self._announcements: Coalesce[tuple[str, str]] = Coalesce(
            notifier.publish_settled_many, name="settled"
        )
        self._wakes: Coalesce[RunRow] = Coalesce(self._publish_wakes, name="wakes")

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivery whose drive has decided."""
        self._acks.add(delivery)

    async def hint(self, row: RunRow) -> None:
        """Hint that a run can move now (released, a child admitted, a parent woken)."""
        self._wakes.add(row)

    async def settled(self, run_id: str, status: str) -> None:
        """Announce a committed settlement to the producers waiting on it."""
        self._announcements.add((run_id, status))

    async def flush(self, timeout: float = 1.0) -> None:
        """Send what is pending (at shutdown: what was decided and settled goes out first)."""
        for pending in (self._acks, self._announcements, self._wakes):
            try:
                await asyncio.wait_for(pending.drain(), timeout=timeout)
            except Exception as exc:
                log.warning("worker.flush_failed", extra={"error": repr(exc)})

    async def _ack_many(self, deliveries: list[Delivery]) -> None:
        try:
            await self._streams.ack_many(deliveries)
        except BROKER_ERRORS as exc:
            log.warning("stream.ack_failed", extra={"runs": len(deliveries), "error": repr(exc)})

    async def _publish_wakes(self, rows: list[RunRow]) -> None:
        try:
            await publish_wakes(self._streams, rows, "schedule")
        except BROKER_ERRORS as exc:
            log.warning("stream.publish_failed", extra={"runs": len(rows), "error": repr(exc)})
