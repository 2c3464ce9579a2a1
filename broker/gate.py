"""The gate of a limited queue: wakes of runs refused for want of a slot (docs/how-to/queues.md).

Postgres decides the limit, in the claim statement (``runfleet.queue_free_slots``); a
refused claim changes nothing and its delivery is acknowledged, so the run needs a new
wake when a slot frees. The refusing worker parks the wake here (per queue, a sorted set
by first refusal: one entry per run); whichever worker ends an execution of that queue
moves the oldest parked wake to
the queue's recovery lane, read before the backlog. Only a hint, like every message: a
lost gate entry delays a run until the lost-wake sweep (DESIGN §7.5), never loses it, and
a stale one (its run started meanwhile) is decided like any stale wake.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from runfleet.broker.codec import message_for
from runfleet.broker.keys import Keys
from runfleet.broker.streams import Lane, Streams
from runfleet.broker.wake_reasons import WakeReason

log = logging.getLogger("runfleet.broker.gate")

GATE_CAP = 100_000
"""The most wakes one queue's gate keeps (the oldest beyond it are trimmed: the lost-wake
sweep still finds their runs), so a refused burst cannot grow Redis without bound."""


class Gate:
    def __init__(self, redis: Redis, prefix: str, streams: Streams) -> None:
        self._redis = redis
        self._keys = Keys(prefix)
        self._streams = streams

    async def park(self, entries: Iterable[tuple[str, str, str]]) -> None:
        """Park the wakes of refused runs, ``(queue, run_id, flow)`` each, in one pipeline."""
        by_queue: dict[str, dict[bytes, float]] = {}
        now = time.time()
        for queue, run_id, flow in entries:
            # The member names the run (ids and flows hold no control character); NX keeps
            # the time it was first refused, so a run refused again is parked once.
            by_queue.setdefault(queue, {})[f"{run_id}\n{flow}".encode()] = now
        if not by_queue:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue, members in by_queue.items():
                key = self._keys.gate(queue)
                pipe.zadd(key, members, nx=True)
                pipe.zremrangebyrank(key, GATE_CAP, -1)  # the newest beyond the cap
            await pipe.execute()

    async def unpark(self, entries: Iterable[tuple[str, str, str]]) -> None:
        """Drop the parked wakes of runs that started (``(queue, run_id, flow)`` each).

        A run refused once and started later by another path (a higher priority taking a
        delivered run's slot, a re-published wake) leaves its entry behind; popped at the
        next freed slot, that stale wake would start nothing and the slot would stay
        empty until the lost-wake sweep, however many runs wait behind it."""
        by_queue: dict[str, list[bytes]] = {}
        for queue, run_id, flow in entries:
            by_queue.setdefault(queue, []).append(f"{run_id}\n{flow}".encode())
        if not by_queue:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue, members in by_queue.items():
                pipe.zrem(self._keys.gate(queue), *members)
            await pipe.execute()

    async def open(self, queues: Iterable[str]) -> int:
        """A slot of each of ``queues`` freed (one entry per freed slot): move that many
        parked wakes to their queue's recovery lane. Returns how many moved."""
        counts: dict[str, int] = {}
        for queue in queues:
            counts[queue] = counts.get(queue, 0) + 1
        moved: list[tuple[str, bytes]] = []
        for queue, n in counts.items():
            popped: list[Any] = list(await self._redis.zpopmin(self._keys.gate(queue), n))
            for member in popped:  # (member, score) pairs
                if isinstance(member[0], bytes):
                    moved.append((queue, member[0]))
        messages = []
        for queue, raw in moved:
            run_id, _, flow = raw.decode("utf-8", "replace").partition("\n")
            try:
                messages.append((queue, message_for(run_id, flow, WakeReason.SLOT)))
            except ValidationError:  # a Redis writer's bytes: dropped, logged
                log.warning("gate.malformed", extra={"queue": queue})
        if messages:
            await self._streams.publish_many(messages, Lane.RECOVERY)
        return len(messages)
