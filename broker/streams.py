"""Queue streams: publish schedule/wake hints, deliver them to workers, reclaim the orphaned.

One stream per queue and one consumer group (``workers``); each worker process is
a consumer named by its owner key. Delivery is at-least-once and only a hint: the
reader acts through Postgres CAS, which makes a duplicate or stale message harmless,
and the Postgres sweeps cover any message Redis loses (trim, FLUSHALL, failover).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker.client import require_binary, socket_timeout_of
from broker.codec import FIELD, MalformedMessage, StreamMessage, decode, encode
from broker.keys import DEFAULT_PREFIX, GROUP, Keys

log = logging.getLogger("runfleet.broker.streams")

DEFAULT_MAXLEN = 100_000
_MAX_BLOCK_SLICE_MS = 1000
_RECLAIM_CALLS_PER_QUEUE = 4

# Why a script: XREADGROUP's COUNT applies to each stream separately, so one call
# over k queues can hand this consumer up to k * COUNT entries, more than the free
# slots the caller has. The script reads the queues in priority order, taking only
# what is still missing, atomically.
_READ_SCRIPT = """
--[[ runfleet: deliver at most ARGV[3] new entries across streams, in priority order.
KEYS[1..n] = queue streams ({prefix}:q:{queue}), highest priority first
ARGV[1]    = consumer group name
ARGV[2]    = consumer name
ARGV[3]    = maximum number of entries to deliver in total (>= 1)
Returns    { entries, tails }
  entries  = list of { index into KEYS (1-based), entry id, { field, value, ... } }
  tails    = per KEYS[i], the id of its newest entry ("0-0" if empty); a caller that
             got no entries waits (XREAD BLOCK) for anything newer than these ids.
Errors     NOGROUP when a stream or its group is missing; the caller recreates both.
]]
local remaining = tonumber(ARGV[3])
local entries = {}
local tails = {}
for i, key in ipairs(KEYS) do
  if remaining > 0 then
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2],
                             'COUNT', remaining, 'STREAMS', key, '>')
    if reply then
      for _, entry in ipairs(reply[1][2]) do
        entries[#entries + 1] = { i, entry[1], entry[2] }
        remaining = remaining - 1
      end
    end
  end
  local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if newest[1] then tails[i] = newest[1][1] else tails[i] = '0-0' end
end
return { entries, tails }
"""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to this consumer; ack it once the drive attempt has decided."""

    queue: str
    entry_id: str
    message: StreamMessage


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Backlog of one queue's group: never delivered, and delivered but unacknowledged."""

    undelivered: int
    pending: int

    @property
    def total(self) -> int:
        return self.undelivered + self.pending


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_nogroup(exc: ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")


class Streams:
    """Publishing to and consuming from the queue streams of one prefix."""

    def __init__(
        self, redis: Redis, prefix: str = DEFAULT_PREFIX, *, maxlen: int = DEFAULT_MAXLEN
    ) -> None:
        self._redis = require_binary(redis)
        self._keys = Keys(prefix)
        self.maxlen = maxlen
        self._read_script = redis.register_script(_READ_SCRIPT)
        self._reclaim_cursor: dict[str, str] = {}
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

    def stream_key(self, queue: str) -> str:
        return self._keys.stream(queue)

    async def ensure_groups(self, queues: Iterable[str]) -> None:
        """Create each queue's stream and group if missing; existing ones are left alone.

        The group starts at id 0, so entries published before any worker existed (or
        while the group was gone) are still delivered. Redelivery is harmless.
        """
        for queue in dict.fromkeys(queues):
            try:
                await self._redis.xgroup_create(
                    self._keys.stream(queue), GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    async def publish(self, queue: str, msg: StreamMessage) -> str:
        """Append one message to ``queue``'s stream; returns the entry id."""
        entry_id = await self._redis.xadd(
            self._keys.stream(queue), {FIELD: encode(msg)}, maxlen=self._maxlen, approximate=True
        )
        return _text(entry_id)

    async def publish_many(self, items: Sequence[tuple[str, StreamMessage]]) -> list[str]:
        """Append many messages in one round trip; returns entry ids in input order.

        Every message is encoded before anything is sent, so a bad one writes nothing.
        """
        if not items:
            return []
        packed = [(self._keys.stream(queue), encode(msg)) for queue, msg in items]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, data in packed:
                pipe.xadd(key, {FIELD: data}, maxlen=self._maxlen, approximate=True)
            ids = await pipe.execute()
        return [_text(i) for i in ids]

    async def read(
        self, consumer: str, queues: list[str], count: int, block_ms: int
    ) -> list[Delivery]:
        """Deliver at most ``count`` new messages, earlier queues first, waiting up to ``block_ms``.

        ``count`` is the caller's free slots: anything read beyond it would sit in this
        consumer's pending list unprocessed until another worker reclaimed it. So
        ``count <= 0`` returns at once without touching Redis. ``block_ms <= 0`` means
        do not wait (unlike Redis, where BLOCK 0 waits forever).
        """
        if count <= 0 or not queues:
            return []
        ordered = list(dict.fromkeys(queues))
        streams = [self._keys.stream(q) for q in ordered]
        deadline = time.monotonic() + max(0, block_ms) / 1000
        while True:
            raw, tails = await self._read_once(consumer, ordered, streams, count)
            deliveries = await self._accept(raw)
            if deliveries:
                return deliveries
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return []
            if raw:
                continue  # only malformed entries (now dropped): look again at once
            # A doorbell: wait for any entry newer than the tails, without consuming it.
            await self._redis.xread(
                dict(zip(streams, tails, strict=True)),
                count=1,
                block=min(remaining_ms, self._block_slice_ms),
            )

    async def _read_once(
        self, consumer: str, queues: list[str], streams: list[str], count: int
    ) -> tuple[list[tuple[str, str, dict[bytes, bytes] | None]], list[str]]:
        try:
            reply = await self._read_script(keys=streams, args=[GROUP, consumer, count])
        except ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            # The group vanished (FLUSHALL, restart without persistence): recreate, retry once.
            log.warning("stream.group_recreated", extra={"queues": queues})
            await self.ensure_groups(queues)
            reply = await self._read_script(keys=streams, args=[GROUP, consumer, count])
        entries: list[Any] = reply[0]
        raw = [(queues[int(e[0]) - 1], _text(e[1]), _pairs(e[2])) for e in entries]
        return raw, [_text(t) for t in reply[1]]

    async def ack(self, queue: str, entry_id: str) -> bool:
        """Acknowledge one delivery; ``False`` if it was not pending (already acked or trimmed)."""
        return bool(await self._redis.xack(self._keys.stream(queue), GROUP, entry_id))

    async def ack_many(self, entries: Iterable[tuple[str, str]]) -> int:
        """Acknowledge ``(queue, entry_id)`` pairs in one round trip; returns the count acked."""
        by_queue: dict[str, list[str]] = defaultdict(list)
        for queue, entry_id in entries:
            by_queue[queue].append(entry_id)
        if not by_queue:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue, ids in by_queue.items():
                pipe.xack(self._keys.stream(queue), GROUP, *ids)
            counts = await pipe.execute()
        return sum(int(c) for c in counts)

    async def reclaim(
        self, consumer: str, queues: list[str], min_idle_ms: int, count: int
    ) -> list[Delivery]:
        """Take over at most ``count`` entries left unacknowledged for ``min_idle_ms`` or more.

        These belong to consumers that died between read and ack. A per-queue cursor
        walks each pending list across calls, so a prefix of entries that are not yet
        idle cannot hide idle ones behind it.
        """
        raw: list[tuple[str, str, dict[bytes, bytes] | None]] = []
        for queue in dict.fromkeys(queues):
            if len(raw) >= count:
                break
            raw.extend(await self._reclaim_queue(consumer, queue, min_idle_ms, count - len(raw)))
        return await self._accept(raw)

    async def _reclaim_queue(
        self, consumer: str, queue: str, min_idle_ms: int, count: int
    ) -> list[tuple[str, str, dict[bytes, bytes] | None]]:
        key = self._keys.stream(queue)
        start = self._reclaim_cursor.get(queue, "0-0")
        from_zero = start == "0-0"
        out: list[tuple[str, str, dict[bytes, bytes] | None]] = []
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
            out.extend((queue, _text(eid), fields) for eid, fields in reply[1])
            if start == "0-0":
                if from_zero:
                    break
                from_zero = True
        self._reclaim_cursor[queue] = start
        return out

    async def _accept(
        self, raw: list[tuple[str, str, dict[bytes, bytes] | None]]
    ) -> list[Delivery]:
        """Decode entries; log, ack and drop the malformed so they are never redelivered."""
        good: list[Delivery] = []
        bad: list[tuple[str, str]] = []
        for queue, entry_id, fields in raw:
            try:
                if fields is None:
                    raise MalformedMessage("entry was deleted")
                if FIELD not in fields:
                    raise MalformedMessage(f"entry has no field {FIELD.decode()!r}")
                good.append(Delivery(queue, entry_id, decode(fields[FIELD])))
            except MalformedMessage as exc:
                log.warning(
                    "stream.malformed",
                    extra={"queue": queue, "entry_id": entry_id, "reason": exc.reason},
                )
                bad.append((queue, entry_id))
        if bad:
            await self.ack_many(bad)
        return good

    async def depth(self, queue: str) -> QueueDepth:
        """The group's backlog: entries not yet delivered, and delivered but unacknowledged.

        Uses XINFO GROUPS (Redis >= 7). When Redis cannot compute ``lag`` (entries
        deleted mid-stream) the stream length stands in: an upper bound, never an undercount.
        """
        key = self._keys.stream(queue)
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

    async def lag(self, queue: str) -> int:
        """Entries waiting for a worker: not yet delivered plus delivered-but-unacknowledged."""
        return (await self.depth(queue)).total

    async def prune_consumers(self, queues: Iterable[str], idle_ms: int) -> int:
        """Delete consumers with nothing pending that have not read for ``idle_ms``.

        Every process start is a new consumer (its name carries the nonce), so without
        pruning the group accumulates the dead. Consumers still holding entries are kept
        until ``reclaim`` empties them. Choose ``idle_ms`` far above a live worker's read
        interval (minutes): deleting a consumer drops its pending list.
        """
        removed = 0
        for queue in dict.fromkeys(queues):
            key = self._keys.stream(queue)
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


def _pairs(flat: Any) -> dict[bytes, bytes] | None:
    """Turn a script's flat ``[field, value, ...]`` list into a dict (``None`` if absent)."""
    if not isinstance(flat, list):
        return None
    return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
