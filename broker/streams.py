"""Queue streams: publish schedule/wake hints, deliver them to workers, reclaim the orphaned.

Two streams per queue, each with the one consumer group (``workers``); each worker
process is a consumer named by its owner key. The normal lane carries admissions in
FIFO order; the recovery lane carries runs that already started (takeovers, released
and woken runs), and every read takes from the recovery lanes first, so recovered
work starts on the next free slot instead of behind the backlog. Delivery is
at-least-once and only a hint: the reader acts through Postgres CAS, which makes a
duplicate or stale message harmless, and the Postgres sweeps cover any message Redis
loses (trim, FLUSHALL, failover).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from runfleet.broker import hostile
from runfleet.broker.client import require_binary, socket_timeout_of
from runfleet.broker.codec import FIELD, MalformedMessage, StreamMessage, decode, encode
from runfleet.broker.keys import DEFAULT_PREFIX, GROUP, Keys
from runfleet.broker.stream_scripts import (
    PUBLISH_CHECKED_SCRIPT,
    PUBLISH_SCRIPT,
    READ_SCRIPT,
)

log = logging.getLogger("runfleet.broker.streams")

DEFAULT_MAXLEN = 100_000
_MAX_BLOCK_SLICE_MS = 1000
_RECLAIM_CALLS_PER_QUEUE = 4

SCRIPT_PUBLISH_FROM = 8
"""Batches of at least this many messages go through the publish script (fewer: XADDs)."""
PUBLISH_CHUNK = 1000
"""The most messages one script call appends (a call blocks Redis while it runs)."""


class Lane(enum.StrEnum):
    """Which of a queue's two streams: read the recovery lane first, always."""

    RECOVERY = "recovery"
    NORMAL = "normal"


def lane_for(epoch: int) -> Lane:
    """The lane a run's wake goes to: runs that already started (epoch > 0: takeovers,
    released or woken runs) resume ahead of any backlog; a never-started run keeps its
    FIFO place."""
    return Lane.RECOVERY if epoch > 0 else Lane.NORMAL


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to this consumer; ack it once the drive attempt has decided.

    ``peeked``: seen by the idle reader's doorbell, not taken from the group (``read``
    with ``peek``). Nothing to acknowledge: the group still holds the entry and hands it
    to some reader later, as a stale duplicate by then (the claim is a CAS)."""

    queue: str
    entry_id: str
    message: StreamMessage
    lane: Lane = Lane.NORMAL
    peeked: bool = False


Raw = tuple[str, Lane, str, "dict[bytes, bytes] | None"]
"""An entry as read: (queue, lane, entry id, fields or None if deleted)."""


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Backlog of one queue's group: never delivered, and delivered but unacknowledged."""

    undelivered: int
    pending: int

    @property
    def total(self) -> int:
        return self.undelivered + self.pending


@dataclass(frozen=True, slots=True, order=True)
class EntryId:
    """A stream entry id ``ms-seq`` as a comparable pair (``0-0``: nothing yet).

    Ids only ever compare with ids of the same stream: they carry Redis's clock, which
    nothing else in runfleet is measured on.
    """

    ms: int = 0
    seq: int = 0

    @classmethod
    def parse(cls, value: bytes | str | None) -> EntryId:
        if value is None:
            return ZERO_ID
        ms, _, seq = _text(value).partition("-")
        return cls(int(ms), int(seq or 0))

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ZERO_ID = EntryId()


@dataclass(frozen=True, slots=True)
class LanePosition:
    """How far one lane's stream was written and delivered, read in that order.

    ``written``: the stream's last generated id (``0-0`` if the stream does not exist).
    ``delivered``: the ``workers`` group's last delivered id, None without the group.
    Since ``written`` is read first, ``delivered >= written`` of the same reading means
    everything the stream held when it was read had been delivered.
    """

    written: EntryId
    delivered: EntryId | None
    first: EntryId | None
    """The oldest entry the stream still holds, None if it holds none (or does not exist):
    every entry below it was trimmed or deleted, delivered or not."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_nogroup(exc: ResponseError) -> bool:
    """A missing stream or group, raised by a command or by one of runfleet's scripts: Redis 7
    passes a script's error code on as the reply's, Redis 6.2 (the ``embedded`` extra's)
    wraps it (``Error running script (...): @user_script:19: NOGROUP ...``)."""
    text = str(exc)
    return text.startswith("NOGROUP") or (
        text.startswith("Error running script") and ": NOGROUP " in text
    )


class Streams:
    """Publishing to and consuming from the queue streams of one prefix."""

    def __init__(
        self, redis: Redis, prefix: str = DEFAULT_PREFIX, *, maxlen: int = DEFAULT_MAXLEN
    ) -> None:
        self._redis = require_binary(redis)
        self._keys = Keys(prefix)
        self.maxlen = maxlen
        self._read_script = redis.register_script(READ_SCRIPT)
        self._publish_script = redis.register_script(PUBLISH_SCRIPT)
        self._publish_checked_script = redis.register_script(PUBLISH_CHECKED_SCRIPT)
        self._reclaim_cursor: dict[str, str] = {}
        self._caught_up: tuple[str, tuple[str, ...], list[str]] | None = None
        """(consumer, streams, tails) of the last read script call that delivered fewer
        entries than it was allowed: every entry up to those tails had been delivered, so
        the next blocking ``read`` of the same streams may go straight to the doorbell."""
        timeout = socket_timeout_of(redis)
        # A block longer than the client's socket timeout would surface as a timeout error.
        self._block_slice_ms = (
            _MAX_BLOCK_SLICE_MS
            if timeout is None
            else max(1, min(_MAX_BLOCK_SLICE_MS, int(timeout * 500)))
        )

    @property
    def maxlen(self) -> int:
        """Approximate cap per stream (``MAXLEN ~``); acked entries are only removed by it."""
        return self._maxlen

    @maxlen.setter
    def maxlen(self, value: int) -> None:
        if value <= 0:
            raise ValueError("maxlen must be positive")
        self._maxlen = value

    def stream_key(self, queue: str, lane: Lane = Lane.NORMAL) -> str:
        if lane is Lane.RECOVERY:
            return self._keys.recovery_stream(queue)
        return self._keys.stream(queue)

    async def ensure_groups(self, queues: Iterable[str]) -> None:
        """Create both lanes' streams and groups of each queue if missing; keep existing ones.

        The group starts at id 0, so entries published before any worker existed (or
        while the group was gone) are still delivered. Redelivery is harmless.
        """
        for queue in dict.fromkeys(queues):
            for lane in Lane:
                try:
                    await self._redis.xgroup_create(
                        self.stream_key(queue, lane), GROUP, id="0", mkstream=True
                    )
                except ResponseError as exc:
                    if not str(exc).startswith("BUSYGROUP"):
                        raise

    async def publish(self, queue: str, msg: StreamMessage, lane: Lane = Lane.NORMAL) -> str:
        """Append one message to ``queue``'s stream in ``lane``; returns the entry id."""
        entry_id = await self._redis.xadd(
            self.stream_key(queue, lane),
            {FIELD: encode(msg)},
            maxlen=self._maxlen,
            approximate=True,
        )
        return _text(entry_id)

    def pack(
        self, items: Sequence[tuple[str, StreamMessage]], lane: Lane = Lane.NORMAL
    ) -> list[tuple[str, bytes]]:
        """Each (queue, message) as its stream key in ``lane`` and its encoded field value;
        every message is encoded before anything is sent, so a bad one writes nothing."""
        return [(self.stream_key(queue, lane), encode(msg)) for queue, msg in items]

    async def publish_many(
        self, items: Sequence[tuple[str, StreamMessage]], lane: Lane = Lane.NORMAL
    ) -> list[str]:
        """Append many messages to ``lane`` in one round trip; returns entry ids in input order.

        Every message is encoded before anything is sent, so a bad one writes nothing.
        """
        if not items:
            return []
        packed = self.pack(items, lane)
        if len(packed) == 1:  # a single enqueue's wake: one XADD, no pipeline to build
            ((key, data),) = packed
            entry_id = await self._redis.xadd(
                key, {FIELD: data}, maxlen=self._maxlen, approximate=True
            )
            return [_text(entry_id)]
        if len(packed) >= SCRIPT_PUBLISH_FROM:
            return await self._publish_scripted(packed)
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, data in packed:
                pipe.xadd(key, {FIELD: data}, maxlen=self._maxlen, approximate=True)
            ids = await pipe.execute()
        return [_text(i) for i in ids]

    async def _publish_scripted(self, packed: list[tuple[str, bytes]]) -> list[str]:
        """``publish_many`` for a large batch: one script call per stream and chunk."""
        by_key: dict[str, list[int]] = {}
        for i, (key, _data) in enumerate(packed):
            by_key.setdefault(key, []).append(i)
        ids = [""] * len(packed)
        for key, positions in by_key.items():
            for start in range(0, len(positions), PUBLISH_CHUNK):
                chunk = positions[start : start + PUBLISH_CHUNK]
                reply = await self._publish_script(
                    keys=[key], args=[self._maxlen, FIELD, *(packed[i][1] for i in chunk)]
                )
                for i, entry_id in zip(chunk, reply, strict=True):
                    ids[i] = _text(entry_id)
        return ids

    async def read(
        self, consumer: str, queues: list[str], count: int, block_ms: int, *, peek: bool = False
    ) -> list[Delivery]:
        """Deliver at most ``count`` new messages, waiting up to ``block_ms``.

        Every queue's recovery lane is read before any normal lane, earlier queues
        first within a lane. ``count`` is the caller's free slots: anything read beyond
        it would sit in this consumer's pending list unprocessed until another worker
        reclaimed it. So ``count <= 0`` returns at once without touching Redis.
        ``block_ms <= 0`` means do not wait (unlike Redis, where BLOCK 0 waits forever).

        ``peek``: when the idle wait's doorbell rings, answer with the entries it returned
        (``Delivery.peeked``) instead of taking them from the group in a second round
        trip. The doorbell consumes nothing, so every idle reader sees the entry and the
        claim in Postgres decides which one runs it; the group still delivers it once
        more, to whichever reader reads next, as a duplicate. A doorbell that saw only
        normal-lane entries while a single slot is free takes from the group as before:
        the read script puts a recovery entry that arrived meanwhile first.

        A read whose script delivered fewer entries than ``count`` leaves nothing
        undelivered up to the tails it answered (the script reads every lane with room to
        spare, atomically), so the next blocking read of the same streams by the same
        consumer skips the script's empty answer and waits on the doorbell from those
        tails at once: an idle worker that runs one arrival at a time pays one Redis round
        trip less per run. Anything that arrived meanwhile rings the doorbell at once, and
        the script then takes it, recovery lanes first.
        """
        if count <= 0 or not queues:
            return []
        unique = list(dict.fromkeys(queues))
        ordered = [(q, lane) for lane in Lane for q in unique]
        streams = [self.stream_key(q, lane) for q, lane in ordered]
        deadline = time.monotonic() + max(0, block_ms) / 1000
        caught_up, self._caught_up = self._caught_up, None
        tails: list[str] | None = None
        if block_ms > 0 and caught_up is not None and caught_up[:2] == (consumer, tuple(streams)):
            tails = caught_up[2]
        while True:
            raw: list[Raw] = []
            if tails is None:
                raw, tails = await self._read_once(consumer, ordered, streams, count)
                deliveries = await self._accept(raw)
                if deliveries:
                    if len(raw) < count:
                        self._caught_up = (consumer, tuple(streams), tails)
                    return deliveries
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return []
            if raw:
                tails = None
                continue  # only malformed entries (now dropped): look again at once
            block = min(remaining_ms, self._block_slice_ms)
            # A doorbell: wait for any entry newer than the tails, without consuming it.
            # Not a blocking XREADGROUP, which would save a round trip: Redis assigns the
            # entry to a blocked consumer when it arrives, so a reader frozen at that moment
            # (SIGSTOP, a GC pause, a partition) would hold the wake in its pending list
            # until the reclaim (3 x stale_after) while other workers sit idle
            # (tests/broker/test_idle_read.py; docs/explanation/admission-path.md).
            rang = await self._redis.xread(
                dict(zip(streams, tails, strict=True)), count=1, block=block
            )
            tails = None  # the script decides what the doorbell rang for
            if peek and rang:
                peeked = self._peeked(rang, dict(zip(streams, ordered, strict=True)), count)
                if peeked:
                    return peeked

    def _peeked(self, reply: Any, lanes: dict[str, tuple[str, Lane]], count: int) -> list[Delivery]:
        """The doorbell's entries as peeked deliveries, recovery lanes first, at most
        ``count``; none when the group read must decide (see ``read``). Malformed entries
        are left to the group read, which drops them."""
        found: list[Delivery] = []
        for key, entries in reply.items() if isinstance(reply, dict) else reply:
            queue, lane = lanes[_text(key)]
            for entry_id, fields in entries:
                try:
                    if not fields or FIELD not in fields:
                        continue
                    message = decode(fields[FIELD])
                except MalformedMessage:
                    continue
                found.append(Delivery(queue, _text(entry_id), message, lane, peeked=True))
        found.sort(key=lambda d: d.lane is not Lane.RECOVERY)
        if count < 2 and not any(d.lane is Lane.RECOVERY for d in found):
            return []
        return found[:count]

    async def _read_once(
        self, consumer: str, ordered: list[tuple[str, Lane]], streams: list[str], count: int
    ) -> tuple[list[Raw], list[str]]:
        try:
            reply = await self._read_script(keys=streams, args=[GROUP, consumer, count])
        except ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            # The group vanished (FLUSHALL, restart without persistence): recreate, retry once.
            queues = list(dict.fromkeys(q for q, _ in ordered))
            log.warning("stream.group_recreated", extra={"queues": queues})
            await self.ensure_groups(queues)
            reply = await self._read_script(keys=streams, args=[GROUP, consumer, count])
        entries: list[Any] = reply[0]
        raw = [(*ordered[int(e[0]) - 1], _text(e[1]), _pairs(e[2])) for e in entries]
        return raw, [_text(t) for t in reply[1]]

    async def ack(self, queue: str, entry_id: str, lane: Lane = Lane.NORMAL) -> bool:
        """Acknowledge one delivery; ``False`` if it was not pending (already acked or trimmed)."""
        return bool(await self._redis.xack(self.stream_key(queue, lane), GROUP, entry_id))

    async def ack_many(self, entries: Iterable[Delivery | tuple[str, str]]) -> int:
        """Acknowledge deliveries (or normal-lane ``(queue, entry_id)`` pairs) in one round trip.

        Returns the count acked.
        """
        return await self._ack_streams(
            (self.stream_key(e.queue, e.lane), e.entry_id)
            if isinstance(e, Delivery)
            else (self.stream_key(e[0]), e[1])
            for e in entries
        )

    async def _ack_streams(self, entries: Iterable[tuple[str, str]]) -> int:
        by_stream: dict[str, list[str]] = defaultdict(list)
        for key, entry_id in entries:
            by_stream[key].append(entry_id)
        if not by_stream:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, ids in by_stream.items():
                pipe.xack(key, GROUP, *ids)
            counts = await pipe.execute()
        return sum(int(c) for c in counts)

    async def reclaim(
        self, consumer: str, queues: list[str], min_idle_ms: int, count: int
    ) -> list[Delivery]:
        """Take over at most ``count`` entries left unacknowledged for ``min_idle_ms`` or more.

        These belong to consumers that died between read and ack. Recovery lanes are
        reclaimed before normal ones. A per-stream cursor walks each pending list
        across calls, so a prefix of entries that are not yet idle cannot hide idle
        ones behind it.
        """
        raw: list[Raw] = []
        unique = list(dict.fromkeys(queues))
        for queue, lane in [(q, lane) for lane in Lane for q in unique]:
            if len(raw) >= count:
                break
            raw.extend(
                await self._reclaim_stream(consumer, queue, lane, min_idle_ms, count - len(raw))
            )
        return await self._accept(raw)

    async def _reclaim_stream(
        self, consumer: str, queue: str, lane: Lane, min_idle_ms: int, count: int
    ) -> list[Raw]:
        key = self.stream_key(queue, lane)
        start = self._reclaim_cursor.get(key, "0-0")
        from_zero = start == "0-0"
        out: list[Raw] = []
        for _ in range(_RECLAIM_CALLS_PER_QUEUE):
            if len(out) >= count:
                break
            try:
                reply = await self._redis.xautoclaim(
                    key, GROUP, consumer, min_idle_ms, start_id=start, count=count - len(out)
                )
            except ResponseError as exc:
                if not _is_nogroup(exc):
                    raise
                await self.ensure_groups([queue])  # a fresh group has nothing to reclaim
                return out
            start = _text(reply[0])
            out.extend((queue, lane, _text(eid), fields) for eid, fields in reply[1])
            if start == "0-0":
                if from_zero:
                    break
                from_zero = True
        self._reclaim_cursor[key] = start
        return out

    async def _accept(self, raw: list[Raw]) -> list[Delivery]:
        """Decode entries; log, ack and drop the malformed so they are never redelivered."""
        good: list[Delivery] = []
        bad: list[tuple[str, str]] = []
        for queue, lane, entry_id, fields in raw:
            try:
                if fields is None:
                    raise MalformedMessage("entry was deleted")
                if FIELD not in fields:
                    raise MalformedMessage(f"entry has no field {FIELD.decode()!r}")
                good.append(Delivery(queue, entry_id, decode(fields[FIELD]), lane))
            except MalformedMessage as exc:  # counted, and logged at a bounded rate
                hostile.dropped(
                    log, "stream", "stream.malformed", exc.reason, queue=queue, entry_id=entry_id
                )
                bad.append((self.stream_key(queue, lane), entry_id))
        if bad:
            await self._ack_streams(bad)
        return good

    async def depth(self, queue: str, lane: Lane = Lane.NORMAL) -> QueueDepth:
        """The group's backlog in one lane: entries not yet delivered, and delivered but unacked.

        Uses XINFO GROUPS (Redis >= 7). When Redis cannot compute ``lag`` (entries
        deleted mid-stream) the stream length stands in: an upper bound, never an undercount.
        """
        key = self.stream_key(queue, lane)
        try:
            groups = await self._redis.xinfo_groups(key)
        except ResponseError as exc:
            if "no such key" in str(exc):
                return QueueDepth(0, 0)
            raise
        for group in groups:
            if _text(group["name"]) == GROUP:
                lag = group.get("lag")
                undelivered = int(lag) if lag is not None else int(await self._redis.xlen(key))
                return QueueDepth(undelivered, int(group["pending"]))
        return QueueDepth(int(await self._redis.xlen(key)), 0)

    async def positions(self, queue: str) -> dict[Lane, LanePosition]:
        """Each lane's written and delivered positions, in one round trip (lost-wake marks).

        Every lane's last generated id is read before any group's last delivered id
        (a pipeline runs in order), so a delivered id at or past a written id means the
        group had delivered everything written up to there.
        """
        keys = [self.stream_key(queue, lane) for lane in Lane]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.xinfo_stream(key)
            for key in keys:
                pipe.xinfo_groups(key)
            replies = await pipe.execute(raise_on_error=False)
        out: dict[Lane, LanePosition] = {}
        for i, lane in enumerate(Lane):
            info, groups = replies[i], replies[len(keys) + i]
            written = _written(info)
            first = _first(info)
            delivered = None
            if not isinstance(groups, Exception):
                for group in groups:
                    if _text(group["name"]) == GROUP:
                        delivered = EntryId.parse(group["last-delivered-id"])
            elif not _no_such_key(groups):
                raise groups
            out[lane] = LanePosition(written, delivered, first)
        return out

    async def publish_checked(
        self, items: Sequence[tuple[str, StreamMessage]], lane: Lane = Lane.NORMAL
    ) -> list[bool]:
        """Append like ``publish_many``, and say for each message whether its queue's group
        will deliver it: its group has not delivered past the new entry's id.

        A group ahead of its stream (``XGROUP SETID`` to a future id) takes every append
        and delivers none of it, so an entry is a wake only while the group's last
        delivered id is below the id its ``XADD`` returned; a stream without the group
        counts as delivering (the next read recreates the group from id 0). Checked in the
        script that appends (``PUBLISH_CHECKED_SCRIPT``): no reader runs in between.
        """
        packed = self.pack(items, lane)
        by_key: dict[str, list[int]] = {}
        for i, (key, _data) in enumerate(packed):
            by_key.setdefault(key, []).append(i)
        out = [False] * len(packed)
        for key, positions in by_key.items():
            for start in range(0, len(positions), PUBLISH_CHUNK):
                chunk = positions[start : start + PUBLISH_CHUNK]
                ids, delivered = await self._publish_checked_script(
                    keys=[key], args=[self._maxlen, GROUP, FIELD, *(packed[i][1] for i in chunk)]
                )
                at = EntryId.parse(delivered) if delivered else None
                for i, entry_id in zip(chunk, ids, strict=True):
                    out[i] = at is None or at < EntryId.parse(entry_id)
        return out

    async def lag(self, queue: str) -> int:
        """Entries waiting for a worker in both lanes: undelivered plus delivered-but-unacked."""
        return sum([(await self.depth(queue, lane)).total for lane in Lane])

    async def prune_consumers(self, queues: Iterable[str], idle_ms: int) -> int:
        """Delete consumers with nothing pending that have not read for ``idle_ms``.

        Every process start is a new consumer (its name carries the nonce), so without
        pruning the group accumulates the dead. Consumers still holding entries are kept
        until ``reclaim`` empties them. Choose ``idle_ms`` far above a live worker's read
        interval (minutes): deleting a consumer drops its pending list.
        """
        removed = 0
        for key in [self.stream_key(q, lane) for q in dict.fromkeys(queues) for lane in Lane]:
            try:
                consumers = await self._redis.xinfo_consumers(key, GROUP)
            except ResponseError as exc:
                if _is_nogroup(exc) or "no such key" in str(exc):
                    continue
                raise
            for c in consumers:
                if int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                    await self._redis.xgroup_delconsumer(key, GROUP, c["name"])
                    removed += 1
        return removed


def _no_such_key(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and "no such key" in str(exc)


def _written(info: Any) -> EntryId:
    """A stream's last generated id from an XINFO STREAM reply (``0-0``: no stream)."""
    if isinstance(info, Exception):
        if _no_such_key(info):
            return ZERO_ID
        raise info
    return EntryId.parse(info["last-generated-id"])


def _first(info: Any) -> EntryId | None:
    """The oldest entry id an XINFO STREAM reply shows, None for an empty or absent stream
    (``_written`` has already raised on any other error)."""
    if isinstance(info, Exception):
        return None
    entry = info.get("first-entry", info.get(b"first-entry"))
    return None if not entry else EntryId.parse(entry[0])


def _pairs(flat: Any) -> dict[bytes, bytes] | None:
    """Turn a script's flat ``[field, value, ...]`` list into a dict (``None`` if absent)."""
    if not isinstance(flat, list):
        return None
    return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
