"""Reading a liveness key without trusting it: bounded reads, one decoder, one judgement.

Anyone with write access to Redis can put anything at a liveness key: another
type (WRONGTYPE), a value of any size, msgpack nested past any stack, a value
with no TTL, a confirmed time from 1970. Reads are therefore bounded (at most
``MAX_VALUE_BYTES`` leave the server; size, value and TTL come from one
pipelined round trip), and ``judge`` turns whatever was read
into one ``KeyState`` without raising.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import msgpack
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

InfoValue: TypeAlias = str | int | bool
KeyState: TypeAlias = Literal[
    "consistent",
    "absent",
    "malformed",
    "inconsistent",
    "without-ttl",
    "ttl-implausible",
    "lapsed",
    "unverified",
]
MAX_VALUE_BYTES = 16 * 1024
"""Far above any key a worker writes (two fields plus started_ms, queues, runs, and the
``versions`` / ``instances`` it carries, at most ``worker.carried.LIMIT`` characters each)."""


@dataclass(frozen=True, slots=True)
class Beat:
    """A decoded liveness value."""

    confirmed_ms: int
    lapsed: bool
    info: dict[str, InfoValue]


@dataclass(frozen=True, slots=True)
class KeyRead:
    """One key as read: PTTL (-2 absent, -1 no TTL), size, at most ``MAX_VALUE_BYTES``.

    ``wrong_type`` holds the server's WRONGTYPE reply when the key is not a string.
    """

    ttl_ms: int
    size: int
    raw: bytes
    wrong_type: str | None = None


@dataclass(frozen=True, slots=True)
class Seen:
    """What a key says about a lease: its state, the decoded beat if any, and the facts."""

    state: KeyState
    beat: Beat | None
    detail: dict[str, InfoValue]


class Unreachable(Exception):
    """Redis did not answer the read (connection, timeout, or an error reply)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}".rstrip(": "))
        self.cause = cause
        reply = isinstance(cause, ResponseError)
        self.detail: dict[str, InfoValue] = {
            "redis": "error-reply" if reply else "unreachable",
            "error": str(self)[:200],
        }


def pack(confirmed_ms: int, lapsed: bool, info: Mapping[str, InfoValue] | None) -> bytes:
    value: dict[str, InfoValue] = dict(info or {})
    value["confirmed_ms"] = confirmed_ms
    value["lapsed"] = lapsed
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(raw: bytes) -> Beat:
    """Decode a liveness value; raise ``ValueError`` (only) if it is not one runfleet wrote."""
    try:
        value: Any = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises assorted types (StackError, FormatError…)
        raise ValueError(f"not msgpack: {type(exc).__name__}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"not a map: msgpack {type(value).__name__}")
    confirmed = value.pop("confirmed_ms", None)
    lapsed = value.pop("lapsed", None)
    if type(confirmed) is not int or type(lapsed) is not bool:
        raise ValueError("lacks confirmed_ms/lapsed")
    info = {str(k): v for k, v in value.items() if isinstance(v, str | int | bool)}
    return Beat(confirmed, lapsed, info)


def _queue(pipe: Any, key: str | bytes) -> None:
    """Size, value, then TTL: a key that expires mid-read reads as absent (PTTL -2).

    Not MULTI/EXEC: Redis refuses transactions outright while over ``maxmemory``,
    and a full Redis must not turn every probe into "unknown".
    """
    pipe.strlen(key)
    pipe.getrange(key, 0, MAX_VALUE_BYTES - 1)
    pipe.pttl(key)


def _read_of(replies: Sequence[Any]) -> KeyRead:
    """One key's three replies; a WRONGTYPE is a fact about the key, any other error raises."""
    size, raw, ttl = replies
    for reply in (ttl, size, raw):
        if isinstance(reply, ResponseError):
            if str(reply).startswith("WRONGTYPE"):
                return KeyRead(int(ttl) if isinstance(ttl, int) else -1, 0, b"", str(reply))
            raise reply
    return KeyRead(int(ttl), int(size), bytes(raw))


async def read_key(redis: Redis, key: str) -> KeyRead:
    """Read one key in one round trip; ``Unreachable`` for any Redis problem but WRONGTYPE.

    The caller bounds the call (``asyncio.timeout``): a client reconnecting to a
    silently dropped server would otherwise wait out its socket timeouts.
    """
    try:
        async with redis.pipeline(transaction=False) as pipe:
            _queue(pipe, key)
            return _read_of(await pipe.execute(raise_on_error=False))
    except (RedisError, OSError) as exc:
        raise Unreachable(exc) from exc


async def read_keys(redis: Redis, keys: Sequence[str | bytes]) -> list[KeyRead]:
    """Read many keys in one round trip (not atomic across keys); raises only Redis errors."""
    if not keys:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            _queue(pipe, key)
        replies = await pipe.execute(raise_on_error=False)
    return [_read_of(replies[3 * i : 3 * i + 3]) for i in range(len(keys))]


def judge(read: KeyRead, max_ttl_ms: int, heartbeat_at_ms: int | None, tolerance_ms: int) -> Seen:
    """What ``read`` says about a lease whose row heartbeat is ``heartbeat_at_ms``.

    In order: absent; malformed (wrong type, oversized, undecodable); without a
    TTL or with an implausible one; lapsed; then consistent only if its confirmed
    time is within ``tolerance_ms`` of the heartbeat (``None``: not checked).
    """
    if read.wrong_type is not None:
        return Seen("malformed", None, {"key": "malformed", "error": read.wrong_type[:200]})
    if read.ttl_ms == -2:
        return Seen("absent", None, {"key": "absent"})
    if read.size > MAX_VALUE_BYTES:
        error = f"value of {read.size} bytes exceeds {MAX_VALUE_BYTES}"
        return Seen("malformed", None, {"key": "malformed", "error": error})
    try:
        beat = unpack(read.raw)
    except ValueError as exc:
        return Seen("malformed", None, {"key": "malformed", "error": str(exc)[:200]})
    facts: dict[str, InfoValue] = {"confirmed_ms": beat.confirmed_ms, "lapsed": beat.lapsed}
    if read.ttl_ms == -1:
        return Seen("without-ttl", beat, {"key": "without-ttl", **facts})
    facts["ttl_ms"] = read.ttl_ms
    if read.ttl_ms > max_ttl_ms:
        return Seen(
            "ttl-implausible", beat, {"key": "ttl-implausible", "max_ttl_ms": max_ttl_ms, **facts}
        )
    if beat.lapsed:
        return Seen("lapsed", beat, {"key": "lapsed", **facts})
    if heartbeat_at_ms is None:
        return Seen("consistent", beat, {"key": "consistent", **facts})
    facts["heartbeat_at_ms"] = heartbeat_at_ms
    if abs(beat.confirmed_ms - heartbeat_at_ms) > tolerance_ms:
        return Seen(
            "inconsistent", beat, {"key": "inconsistent", "tolerance_ms": tolerance_ms, **facts}
        )
    return Seen("consistent", beat, {"key": "consistent", **facts})
