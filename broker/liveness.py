"""Liveness keys and the probe a would-be thief consults before taking a stale run.

A steal needs two witnesses (DESIGN §5): a stale lease, which Postgres judges,
and a probe that does not vouch for the owner, which this module answers. The
probe errs towards "unknown" only where it truly cannot tell; "unknown" lets the
steal proceed on the lease alone, journaled as ``lease-expired``.

A key vouches only while it is consistent with the lease it claims (DESIGN §5,
rules from partitions): it has a plausible TTL, it decodes, it is not lapsed,
and its ``confirmed_ms`` lies within ``tolerance`` of the row's heartbeat. An
older key (a leftover, or forged "from 1970") says nothing about this lease; a
newer one means the owner has confirmed renewals since that did not include this
run, so it no longer holds it. Either way the verdict is "unknown" and the lease
decides: Redis, which anyone with write access can fill, never vouches alone.
The key checks themselves live in ``broker.liveness_keys``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from redis.asyncio import Redis

from runfleet.broker import hostile
from runfleet.broker.client import require_binary
from runfleet.broker.keys import Keys
from runfleet.broker.liveness_keys import (
    Beat,
    InfoValue,
    KeyRead,
    Seen,
    Unreachable,
    judge,
    pack,
    read_key,
    read_keys,
)
from runfleet.store.config import Settings
from runfleet.store.types import Owner

log = logging.getLogger("runfleet.broker.liveness")

Verdict: TypeAlias = Literal["alive", "dead", "unknown"]
Evidence: TypeAlias = Literal[
    "same-host-pid-alive",
    "same-host-pid-dead",
    "same-host-pid-reused",
    "cross-host-key-fresh",
    "cross-host-unreachable-stale",
    "owner-lapsed",
    "lease-expired",
    "self-orphaned",
]
DEFAULT_HEARTBEAT_INTERVAL = 1.0
MAX_TTL_FACTOR = 10
"""A TTL above this many times the expected one was not set by a runfleet worker."""
TOLERANCE_INTERVALS = 2
"""How far (in heartbeat intervals) a key's confirmed time may sit from the row's heartbeat.

Older by up to one interval is normal (a run claimed after the last confirmed
renewal), plus one interval of refresh lag; newer by more than that means the
owner renewed without this run. Both sides use the same bound.
"""
_FLEET_BATCH = 500


@dataclass(frozen=True, slots=True)
class Probe:
    """What the probe saw: a verdict, its evidence kind (journaled), and raw facts.

    ``detail["key"]`` says which case applied: ``consistent``, ``absent``,
    ``malformed``, ``inconsistent`` (with ``confirmed_ms`` and ``heartbeat_at_ms``),
    ``without-ttl``, ``ttl-implausible``, or ``unverified`` (with ``redis``:
    ``unreachable`` or ``error-reply``).
    """

    verdict: Verdict
    evidence: Evidence
    detail: dict[str, InfoValue] = field(default_factory=dict, hash=False)

    @property
    def vouches(self) -> bool:
        """Only an ``alive`` verdict refuses a steal; ``dead`` and ``unknown`` let it proceed."""
        return self.verdict == "alive"


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One live (or lapsed, or suspect) worker process as its liveness key describes it."""

    host: str
    pid: int
    nonce: str
    confirmed_ms: int
    lapsed: bool
    started_ms: int | None
    queues: tuple[str, ...]
    runs: int | None
    ttl_ms: int
    info: dict[str, InfoValue] = field(default_factory=dict, hash=False)
    suspect: str | None = None
    """Why this key is not one a live worker would write (no TTL, an absurd time), if so."""

    @property
    def owner(self) -> Owner:
        return Owner(host_id=self.host, pid=self.pid, nonce=self.nonce)

    @property
    def live(self) -> bool:
        """Counts as a live worker: neither lapsed nor suspect."""
        return not self.lapsed and self.suspect is None


def _pid_state(pid: int) -> Literal["running", "gone", "zombie"]:
    """Whether ``pid`` names a process on this host that can still act.

    ``os.kill(pid, 0)`` delivers nothing; it only asks the kernel whether the pid
    exists (``PermissionError`` means it does, under another user). A zombie has
    exited and merely awaits its parent's ``wait``: it will never renew a lease.
    """
    if pid <= 0:  # 0 and negatives address process groups, never one owner
        return "gone"
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return "gone"
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z":
            return "zombie"
    except (OSError, ValueError):
        pass  # no procfs (not Linux) or it raced an exit: the kill answer stands
    return "running"


class Liveness:
    """Refreshes this process's liveness key and probes other owners' keys.

    Build it with ``for_settings`` so that the expected TTL, the tolerance and the
    timeouts follow the fleet's heartbeat interval. Every Redis call is bounded by
    ``timeout`` (well under one interval), on top of the client's socket timeouts.
    """

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        host_id: str,
        *,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        stale_after: float | None = None,
        key_ttl: float | None = None,
        timeout: float | None = None,
    ) -> None:
        if not host_id:
            raise ValueError("host_id is required: the probe branches on same host vs other")
        if heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        self._redis = require_binary(redis)
        self._keys = Keys(prefix)
        self.host_id = host_id
        interval_ms = int(heartbeat_interval * 1000)
        # Unset bounds follow the fleet's rules (Settings' properties); an unset
        # stale_after is Settings' default ratio, five intervals.
        fleet = Settings.model_construct(
            heartbeat_interval=heartbeat_interval,
            stale_after=stale_after or 5 * heartbeat_interval,
        )
        self.key_ttl_ms = int((key_ttl if key_ttl is not None else fleet.liveness_ttl) * 1000)
        self.max_ttl_ms = MAX_TTL_FACTOR * self.key_ttl_ms
        self.tolerance_ms = TOLERANCE_INTERVALS * interval_ms
        self.stale_after_ms = fleet.stale_after_ms
        self.timeout = timeout if timeout is not None else fleet.liveness_timeout

    @classmethod
    def for_settings(cls, redis: Redis, settings: Settings) -> Liveness:
        """The probe and key writer for a fleet configured by ``settings``."""
        return cls(
            redis,
            settings.redis_prefix,
            settings.host_id,
            heartbeat_interval=settings.heartbeat_interval,
            stale_after=settings.stale_after,
            key_ttl=settings.liveness_ttl,
            timeout=settings.liveness_timeout,
        )

    async def refresh(
        self,
        owner: Owner,
        confirmed_ms: int,
        lapsed: bool,
        ttl_s: float | None = None,
        info: Mapping[str, InfoValue] | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Write ``owner``'s key with its last confirmed lease time; expires after ``ttl_s``.

        ``confirmed_ms`` is database time of the last renewal Postgres confirmed;
        ``lapsed`` says the process has stopped its runs for want of confirmation,
        so a thief need not wait for the key to expire. ``info`` carries what
        ``runfleet fleet`` shows (``started_ms``, ``queues`` comma-joined, ``runs``).
        ``ttl_s`` defaults to ``Settings.liveness_ttl`` (three intervals). Bounded by
        ``timeout`` (default ``self.timeout``). Raises only Redis errors
        (``RedisError``, ``OSError``, ``TimeoutError``): the caller logs and goes on.
        """
        ttl_ms = self.key_ttl_ms if ttl_s is None else max(1, int(ttl_s * 1000))
        async with asyncio.timeout(self.timeout if timeout is None else timeout):
            await self._redis.set(
                self._keys.alive(owner), pack(confirmed_ms, lapsed, info), px=ttl_ms
            )

    async def clear(self, owner: Owner, *, timeout: float | None = None) -> None:
        """Remove ``owner``'s key (clean shutdown), so probes see it gone at once.

        Bounded like ``refresh``; raises only Redis errors.
        """
        async with asyncio.timeout(self.timeout if timeout is None else timeout):
            await self._redis.delete(self._keys.alive(owner))

    async def probe(self, owner: Owner, heartbeat_at_ms: int | None) -> Probe:
        """Answer whether ``owner`` may still be running the run whose lease it holds.

        ``heartbeat_at_ms`` is that run's last heartbeat in database time (for a
        stranded claim, its claim time): the key vouches only if its confirmed time
        is within ``tolerance_ms`` of it. ``None`` (no row at hand) skips that check,
        so only callers that do not decide a steal may pass it. Never raises: no
        answer within ``timeout`` is "unknown" (or, on the owner's own host with its
        pid running, "alive": see the README's design notes).
        """
        same_host = owner.host_id == self.host_id
        if same_host:
            state = _pid_state(owner.pid)
            if state != "running":
                return Probe("dead", "same-host-pid-dead", {"pid": owner.pid, "pid_state": state})
        seen = await self._see(owner, heartbeat_at_ms)
        detail = {"pid": owner.pid, **seen.detail} if same_host else dict(seen.detail)
        match seen.state:
            case "unverified":
                if same_host:
                    # The pid is alive and Redis cannot tell its nonce. The probe vouches: on one
                    # host a live pid is strong evidence, a reused pid is rare, and a live
                    # owner whose lease went stale is a stuck process an operator must see.
                    # The refusal is re-probed on the backoff ladder.
                    return Probe("alive", "same-host-pid-alive", detail)
                return Probe("unknown", "lease-expired", detail)
            case "absent":
                if same_host:
                    # The pid exists but no process with this nonce refreshes a key: the
                    # pid now belongs to someone else (or the owner stopped refreshing).
                    return Probe("dead", "same-host-pid-reused", detail)
                return Probe("dead", "cross-host-unreachable-stale", detail)
            case "lapsed":
                return Probe("dead", "owner-lapsed", detail)
            case "consistent":
                evidence: Evidence = "same-host-pid-alive" if same_host else "cross-host-key-fresh"
                return Probe("alive", evidence, detail)
            case _:
                # Present but not a key a live owner of this lease would hold: the lease
                # decides, on this host as on any other.
                return Probe("unknown", "lease-expired", detail)

    async def _see(self, owner: Owner, heartbeat_at_ms: int | None) -> Seen:
        key = self._keys.alive(owner)
        try:
            async with asyncio.timeout(self.timeout):
                read = await read_key(self._redis, key)
        except Unreachable as exc:
            hostile.error_reply(log, "liveness-probe", "liveness.probe_failed", exc.cause, key=key)
            return Seen("unverified", None, {"key": "unverified", **exc.detail})
        except TimeoutError as exc:
            hostile.error_reply(log, "liveness-probe", "liveness.probe_failed", exc, key=key)
            detail: dict[str, InfoValue] = {"key": "unverified", "redis": "unreachable"}
            return Seen("unverified", None, {**detail, "error": f"no answer in {self.timeout}s"})
        seen = judge(read, self.max_ttl_ms, heartbeat_at_ms, self.tolerance_ms)
        if seen.state == "malformed":
            hostile.dropped(
                log, "liveness", "liveness.malformed", str(seen.detail["error"]), key=key
            )
        return seen

    async def fleet(self, now_ms: int | None = None) -> list[FleetMember]:
        """Every process with a liveness key under this prefix, sorted by host and pid.

        ``now_ms`` (database time, if known) lets a member be marked ``suspect``
        when its confirmed time is absurd; a key without a TTL, or with one no
        worker sets, is suspect regardless. Keys that are not runfleet's are
        dropped (counted, logged). Raises only Redis errors.
        """
        names = [
            k
            async for k in self._redis.scan_iter(match=self._keys.alive_pattern, count=_FLEET_BATCH)
        ]
        members: list[FleetMember] = []
        for start in range(0, len(names), _FLEET_BATCH):
            batch = names[start : start + _FLEET_BATCH]  # raw names: read what SCAN found
            for key, read in zip(batch, await read_keys(self._redis, batch), strict=True):
                name = key.decode(errors="replace") if isinstance(key, bytes) else key
                member = self._member(name, read, now_ms)
                if member is not None:
                    members.append(member)
        return sorted(members, key=lambda m: (m.host, m.pid, m.nonce))

    def _member(self, name: str, read: KeyRead, now_ms: int | None) -> FleetMember | None:
        owner = self._keys.owner_of(name)
        if owner is None or read.ttl_ms == -2:  # not ours, or expired between SCAN and read
            return None
        seen = judge(read, self.max_ttl_ms, None, self.tolerance_ms)
        beat = seen.beat
        if beat is None:
            hostile.dropped(
                log, "liveness", "liveness.malformed", str(seen.detail.get("error")), key=name
            )
            return None
        info = dict(beat.info)
        started = info.pop("started_ms", None)
        queues = info.pop("queues", "")
        runs = info.pop("runs", None)
        return FleetMember(
            host=owner.host_id,
            pid=owner.pid,
            nonce=owner.nonce,
            confirmed_ms=beat.confirmed_ms,
            lapsed=beat.lapsed,
            started_ms=started if type(started) is int else None,
            queues=tuple(q for q in str(queues).split(",") if q),
            runs=runs if type(runs) is int else None,
            ttl_ms=max(0, read.ttl_ms),
            info=info,
            suspect=self._suspicion(read.ttl_ms, beat, now_ms),
        )

    def _suspicion(self, ttl_ms: int, beat: Beat, now_ms: int | None) -> str | None:
        if ttl_ms == -1:
            return "key without TTL"
        if ttl_ms > self.max_ttl_ms:
            return f"TTL {ttl_ms} ms, above the {self.max_ttl_ms} ms any worker sets"
        if now_ms is None:
            return None
        if beat.confirmed_ms > now_ms + self.tolerance_ms:
            return f"lease confirmed {beat.confirmed_ms - now_ms} ms in the future"
        if not beat.lapsed and beat.confirmed_ms < now_ms - self.stale_after_ms:
            return (
                f"lease confirmed {now_ms - beat.confirmed_ms} ms ago, yet not lapsed "
                f"(a live worker lapses before {self.stale_after_ms} ms)"
            )
        return None
