"""Wake marks: how the fleet knows a pending run's wake is lost, not merely queued.

A never-started pending run is *lost* only when no message a reader will still deliver
names it. Admission writes nothing per run for this (no stream id on the row): the row
already carries its admission time on the Postgres clock, and this module turns what a
worker reads of its queues' streams into a per-queue Postgres time, the **wake mark**,
before which every admission's message has been delivered or destroyed.

The argument (docs/explanation/backlogs.md gives it with the bound):

1. A sample is (P, W_lane): P = ``runfleet.now_ms()`` read first, then each lane's last
   generated stream id W. An admission committed at Postgres time c publishes its message
   after its commit; if the publish reached Redis within ``wake_publish_grace_ms`` and
   c <= P - grace, the entry was in the stream when the sample read it: its id <= W.
2. A later reading (the *witness*) covers the sample, lane by lane, when its group's last
   delivered id >= W (everything up to W was handed to a reader: XREADGROUP ``>`` never
   skips an entry that exists, and trimmed ones are skipped past), or the stream's last
   generated id is now below W or the stream is gone (it was deleted or flushed since:
   the entries are destroyed), or its oldest remaining entry is past W or it holds none
   (everything up to W was trimmed: on an idle queue no later entry would ever move the
   group's delivered id past W), or W was 0-0 (the stream held nothing).
3. A reader claims what it was handed within ``wake_claim_grace_ms``, so a witness is
   used only once it is that old: a run it covers that is still pending and unclaimed
   was handed out and left (a flow this fleet does not know, a limit) or never reached
   Redis (a refused publish, a producer that died between commit and publish).

So mark = P - publish grace of the newest sample a settled witness covers. Clocks:
Postgres times are compared only with Postgres times (P with created/updated_at_ms),
stream ids only with ids of the same stream read by the same worker; nothing compares
Redis's clock with Postgres's. A producer slower than the grace, or a reader slower than
the claim grace, only costs a second message (the claim is a CAS). A healthy deep backlog
gets none: its runs were admitted after every sample its readers have caught up with.

If this worker cannot read its streams at all (Redis down), a message could not be
delivered anyway: the sweep falls back to the age rule (``lost_pending_after_ms``) for
as long as that lasts, and its dispatch drives the runs locally.

The same reading checks the lanes (``broker.stream_health``): a group ahead of its stream,
a group or stream gone, a key of another type at the stream's name is repaired on the
tick that sees it and logged ``stream.repaired``. A group found ahead reads as having
delivered everything its stream held then (whatever the rewind brings back), so the marks
pass the runs it hid and the lost-pending sweep dispatches them again. Such a queue stays
*untrusted* for ``lost_pending_after_ms`` after its last repair: a client that set its group
ahead once may do so again right after any wake, so the sweep drives its lost runs in this
process instead of publishing (``worker.intake``), and elsewhere counts a wake only where the
group will deliver it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

import runfleet.worker.metrics as metrics
from runfleet.broker.stream_health import Fault, LaneHealth, StreamHealth
from runfleet.broker.streams import ZERO_ID, EntryId, Lane, LanePosition, Streams
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.sweeps import MIN_KEY

log = logging.getLogger("runfleet.worker.wake_marks")

MAX_SAMPLES = 4096
"""Samples kept per queue while its readers catch up; beyond, every other is dropped
(a coarser history only makes the mark later, never wrong)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a queue's lanes: the database time read before them, and each lane."""

    at_ms: int
    lanes: dict[Lane, LanePosition]


def covers(witness: Sample, sample: Sample) -> bool:
    """Whether every entry the sample's lanes held is delivered or destroyed by ``witness``."""
    for lane, then in sample.lanes.items():
        now = witness.lanes.get(lane)
        if then.written == ZERO_ID:
            continue  # the lane held nothing
        if now is None:
            return False
        if now.written < then.written:
            continue  # ids never go back within a stream's life: it was recreated since
        if now.first is None or now.first > then.written:
            continue  # everything it held is trimmed away (an idle queue gets no new entry)
        if now.delivered is None or now.delivered < then.written:
            return False
    return True


@dataclass
class MarkBook:
    """One queue's samples since its last mark, and the mark they give."""

    publish_grace_ms: int
    claim_grace_ms: int
    samples: list[Sample] = field(default_factory=list)
    mark_ms: int | None = None

    def observe(self, sample: Sample) -> int | None:
        """Add a sample; the queue's mark if it moved (database time), else None."""
        self.samples.append(sample)
        settled = sample.at_ms - self.claim_grace_ms
        witness_at = _newest_at_or_before(self.samples, settled)
        if witness_at is None:
            self._thin()
            return None
        witness = self.samples[witness_at]
        for i in range(witness_at, -1, -1):
            if covers(witness, self.samples[i]):
                mark = self.samples[i].at_ms - self.publish_grace_ms
                del self.samples[:i]  # older samples can only give older marks
                if self.mark_ms is None or mark > self.mark_ms:
                    self.mark_ms = mark
                    return mark
                return None
        self._thin()
        return None

    def _thin(self) -> None:
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[:-1:2] + self.samples[-1:]


def _newest_at_or_before(samples: Sequence[Sample], at_ms: int) -> int | None:
    for i in range(len(samples) - 1, -1, -1):
        if samples[i].at_ms <= at_ms:
            return i
    return None


class WakeMarks:
    """Samples this worker's queues every sweep tick and advances their wake marks."""

    def __init__(
        self,
        store: Store,
        streams: Streams,
        queues: Sequence[str],
        settings: Settings,
        health: StreamHealth | None = None,
    ) -> None:
        self._store = store
        self._streams = streams
        self._health = health
        """Repairs the lanes a reading finds unable to deliver (None: only marks)."""
        self._faulted: dict[str, float] = {}
        """Each queue's last repair (monotonic time): ``untrusted``."""
        self._delivered: dict[tuple[str, Lane], EntryId] = {}
        """Each lane's last delivered id in its last sound reading: where a group found
        ahead is rewound to, so what the fault hid is delivered again at once."""
        self._queues = list(dict.fromkeys(queues))
        self._settings = settings
        self._books = {
            q: MarkBook(settings.wake_publish_grace_ms, settings.wake_claim_grace_ms)
            for q in self._queues
        }
        self.redis_unreachable = False
        """The last sample could not read the streams: the sweep uses the age rule."""

    def fallback_before_ms(self, now_ms: int) -> int:
        """The age bound the lost-pending sweep adds to the marks: none while Redis answers."""
        if self.redis_unreachable:
            return now_ms - self._settings.lost_pending_after_ms
        return MIN_KEY

    async def sample(self) -> None:
        """Read every queue's lanes once (after one database time) and advance the marks.

        Never raises: a failure is logged and counted, and the next tick samples again.
        """
        if not self._queues:
            return
        try:
            at_ms = await self._store.stats.now_ms()
        except Exception as exc:
            log.warning("wake_marks.failed", extra={"error": repr(exc)})
            metrics.INFRA_ERRORS.labels("wake_marks").inc()
            return
        readings: list[tuple[str, Sample]] = []
        try:
            for queue in self._queues:
                readings.append((queue, Sample(at_ms, await self._checked(queue))))
        except Exception as exc:  # BROKER_ERRORS, or replies a hostile writer shaped
            if not self.redis_unreachable:
                log.warning("wake_marks.redis_unreachable", extra={"error": repr(exc)})
            self.redis_unreachable = True
            metrics.INFRA_ERRORS.labels("wake_marks").inc()
            return
        self.redis_unreachable = False
        for queue, sample in readings:
            mark = self._books[queue].observe(sample)
            if mark is None:
                continue
            try:
                await self._store.sweeps.advance_wake_mark(queue, mark)
            except Exception as exc:  # the book keeps the mark: the next advance carries it
                self._books[queue].mark_ms = None
                log.warning("wake_marks.failed", extra={"queue": queue, "error": repr(exc)})
                metrics.INFRA_ERRORS.labels("wake_marks").inc()

    async def _checked(self, queue: str) -> dict[Lane, LanePosition]:
        """``queue``'s lane positions, after repairing any lane they show unable to deliver.

        A reading is only a trigger: the positions are read without atomicity (a busy lane
        can show a delivered id past the written one it read a moment before), and the
        repair script checks again atomically before changing anything.
        """
        try:
            lanes = await self._streams.positions(queue)
        except ResponseError as exc:
            if self._health is None or not str(exc).startswith("WRONGTYPE"):
                raise
            await self._repair(queue, list(Lane))
            return await self._streams.positions(queue)
        if self._health is None:
            return lanes
        suspect = [lane for lane, at in lanes.items() if _suspect(at)]
        for lane, at in lanes.items():
            if lane not in suspect and at.delivered is not None:
                self._delivered[(queue, lane)] = at.delivered
        if not suspect:
            return lanes
        faults = await self._repair(queue, suspect)
        if not faults:
            return lanes
        lanes = await self._streams.positions(queue)
        return {lane: _through(at, faults.get(lane)) for lane, at in lanes.items()}

    def untrusted(self, queue: str) -> bool:
        """Whether a lane of ``queue`` was found stranded (its group ahead of its stream, or
        another type of key at its name) within the last ``lost_pending_after_ms``: a wake
        published there now may be hidden again by whoever did it (a client that keeps
        re-setting the group), so a sweep drives the queue's lost runs in this process
        rather than through its stream."""
        at = self._faulted.get(queue)
        if at is None:
            return False
        return time.monotonic() - at < self._settings.lost_pending_after_ms / 1000

    async def _repair(self, queue: str, lanes: list[Lane]) -> dict[Lane, LaneHealth]:
        """Repair ``queue``'s ``lanes`` where the script finds a fault; the lanes it found
        faulty, as found."""
        assert self._health is not None
        faults: dict[Lane, LaneHealth] = {}
        for lane in lanes:
            rewind = self._delivered.get((queue, lane))
            found = await self._health.repair(
                self._streams.stream_key(queue, lane), str(rewind) if rewind else ""
            )
            if found.fault is None:
                continue
            faults[lane] = found
            if found.fault.strands:  # a missing stream or group is recreated from id 0
                self._faulted[queue] = time.monotonic()
            metrics.STREAM_REPAIRS.labels(found.fault.value).inc()
            log.warning(
                "stream.repaired",
                extra={
                    "queue": queue,
                    "lane": lane.value,
                    "fault": found.fault.value,
                    "delivered": found.delivered,
                    "written": found.written,
                    "found": found.found,
                },
            )
        return faults


def _through(at: LanePosition, found: LaneHealth | None) -> LanePosition:
    """A lane's position after its repair. A group found ahead of its stream may have
    hidden every entry up to the stream's last id then, for good (the rewind can only
    bring back what it hid since the last sound reading, and a client may set it ahead
    again at once): those entries count as delivered, so the marks pass their runs and
    the lost-pending sweep wakes them again. (A missing stream or group is recreated
    from id 0, and a stream that was another key's type is a new stream: ``covers``
    reads both as they are.)"""
    if found is None or found.fault is not Fault.GROUP_AHEAD:
        return at
    skipped = EntryId.parse(found.written)
    if at.delivered is not None and at.delivered >= skipped:
        return at
    return LanePosition(at.written, skipped, at.first)


def _suspect(at: LanePosition) -> bool:
    """Whether a reading shows a lane that may not deliver: no group (or no stream), or a
    group that delivered past what the stream was written to."""
    return at.delivered is None or at.delivered > at.written
