"""The liveness probe (DESIGN §5) against real processes and a real Redis."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest
from redis.asyncio import Redis

from runfleet.broker.liveness import Liveness
from runfleet.store.types import Owner
from tests.support.polling import until


def nonce() -> str:
    return uuid.uuid4().hex[:12]


HB = 1_764_000_000_000
"""A row heartbeat (database ms) that the keys below are refreshed consistently with."""


async def exited_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    return proc.pid


def spawn_zombie() -> subprocess.Popen[bytes]:
    """A child that exits at once and is not reaped until the caller waits for it."""
    return subprocess.Popen([sys.executable, "-c", "pass"])


# ---- same host -----------------------------------------------------------------


async def test_same_host_dead_pid_is_dead(liveness: Liveness, host_id: str) -> None:
    owner = Owner(host_id, await exited_pid(), nonce())
    # Even a leftover key cannot vouch for a pid that no longer exists.
    await liveness.refresh(owner, confirmed_ms=HB, lapsed=False, ttl_s=3)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("dead", "same-host-pid-dead")
    assert not probe.vouches


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_same_host_zombie_is_dead(liveness: Liveness, host_id: str) -> None:
    child = spawn_zombie()
    try:

        async def state() -> bytes:
            with open(f"/proc/{child.pid}/stat", "rb") as fh:  # noqa: ASYNC230 - procfs read
                stat = fh.read()
            return stat[stat.rindex(b")") + 2 :][:1]

        await until(state, accept=lambda s: s == b"Z")
        probe = await liveness.probe(Owner(host_id, child.pid, nonce()), HB)
        assert (probe.verdict, probe.evidence) == ("dead", "same-host-pid-dead")
        assert probe.detail["pid_state"] == "zombie"
    finally:
        child.wait()


async def test_same_host_live_pid_with_its_key_is_alive(liveness: Liveness, host_id: str) -> None:
    owner = Owner(host_id, os.getpid(), nonce())
    await liveness.refresh(owner, confirmed_ms=HB + 300, lapsed=False, ttl_s=3)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("alive", "same-host-pid-alive")
    assert probe.detail["key"] == "consistent"
    assert (probe.detail["confirmed_ms"], probe.detail["heartbeat_at_ms"]) == (HB + 300, HB)
    assert 0 < int(probe.detail["ttl_ms"]) <= 3000
    assert probe.vouches


async def test_same_host_live_pid_without_key_for_nonce_is_reused(
    liveness: Liveness, host_id: str
) -> None:
    mine = Owner(host_id, os.getpid(), nonce())
    await liveness.refresh(mine, confirmed_ms=HB, lapsed=False, ttl_s=3)
    # The same pid under another nonce: an earlier process whose pid this one now holds.
    earlier = Owner(host_id, os.getpid(), nonce())
    probe = await liveness.probe(earlier, HB)
    assert (probe.verdict, probe.evidence) == ("dead", "same-host-pid-reused")


async def test_same_host_lapsed_owner_is_dead(liveness: Liveness, host_id: str) -> None:
    owner = Owner(host_id, os.getpid(), nonce())
    await liveness.refresh(owner, confirmed_ms=HB, lapsed=True, ttl_s=3)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("dead", "owner-lapsed")


async def test_same_host_redis_down_trusts_a_live_pid(
    dead_redis: Redis, redis_prefix: str, host_id: str
) -> None:
    offline = Liveness(dead_redis, redis_prefix, host_id)
    started = time.monotonic()
    probe = await offline.probe(Owner(host_id, os.getpid(), nonce()), HB)
    assert (probe.verdict, probe.evidence) == ("alive", "same-host-pid-alive")
    assert (probe.detail["key"], probe.detail["redis"]) == ("unverified", "unreachable")
    assert time.monotonic() - started < 1.0
    # A dead pid needs no Redis at all.
    dead = await offline.probe(Owner(host_id, await exited_pid(), nonce()), HB)
    assert (dead.verdict, dead.evidence) == ("dead", "same-host-pid-dead")


async def test_nonpositive_pid_is_never_signalled(liveness: Liveness, host_id: str) -> None:
    for pid in (0, -1):
        probe = await liveness.probe(Owner(host_id, pid, nonce()), HB)
        assert (probe.verdict, probe.evidence) == ("dead", "same-host-pid-dead")


# ---- other hosts ---------------------------------------------------------------


async def test_cross_host_fresh_key_is_alive(liveness: Liveness) -> None:
    owner = Owner("elsewhere", 4242, nonce())
    await liveness.refresh(owner, confirmed_ms=HB - 900, lapsed=False, ttl_s=3)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("alive", "cross-host-key-fresh")
    assert (probe.detail["key"], probe.detail["confirmed_ms"]) == ("consistent", HB - 900)


async def test_cross_host_expired_key_is_dead(liveness: Liveness) -> None:
    owner = Owner("elsewhere", 4242, nonce())
    await liveness.refresh(owner, confirmed_ms=HB, lapsed=False, ttl_s=0.1)
    probe = await until(lambda: liveness.probe(owner, HB), accept=lambda p: p.verdict == "dead")
    assert (probe.evidence, probe.detail["key"]) == ("cross-host-unreachable-stale", "absent")
    never = await liveness.probe(Owner("elsewhere", 1, nonce()), HB)
    assert (never.verdict, never.evidence) == ("dead", "cross-host-unreachable-stale")


async def test_cross_host_lapsed_is_dead(liveness: Liveness) -> None:
    owner = Owner("elsewhere", 4242, nonce())
    await liveness.refresh(owner, confirmed_ms=HB, lapsed=True, ttl_s=3)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("dead", "owner-lapsed")


async def test_cross_host_redis_unreachable_is_unknown_within_the_probe_timeout(
    dead_redis: Redis, redis_prefix: str, host_id: str
) -> None:
    offline = Liveness(dead_redis, redis_prefix, host_id)
    started = time.monotonic()
    probe = await offline.probe(Owner("elsewhere", 4242, nonce()), HB)
    assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired")
    assert (probe.detail["key"], probe.detail["redis"]) == ("unverified", "unreachable")
    assert not probe.vouches
    assert time.monotonic() - started < 1.0


async def test_garbage_at_the_key_is_unknown_cross_host(
    liveness: Liveness, redis: Redis, redis_prefix: str
) -> None:
    owner = Owner("elsewhere", 4242, nonce())
    await redis.set(f"{redis_prefix}:alive:{owner.key}", b"\xc1garbage", px=3000)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired")
    assert probe.detail["key"] == "malformed"


# ---- refresh, clear, fleet ------------------------------------------------------


async def test_clear_removes_the_key(liveness: Liveness) -> None:
    owner = Owner("elsewhere", 7, nonce())
    await liveness.refresh(owner, confirmed_ms=HB, lapsed=False, ttl_s=3)
    await liveness.clear(owner)
    assert (await liveness.probe(owner, HB)).verdict == "dead"
    await liveness.clear(owner)  # twice is harmless


async def test_fleet_lists_members(liveness: Liveness, redis: Redis, redis_prefix: str) -> None:
    a = Owner("host:a", 10, nonce())  # a host id with ':' still parses
    b = Owner("host-b", 20, nonce())
    await liveness.refresh(
        a, 100, False, 3, {"started_ms": 50, "queues": "default,high", "runs": 3, "ver": "1"}
    )
    await liveness.refresh(b, 200, True, 3)
    await redis.set(f"{redis_prefix}:alive:host-c:30:abc", b"not msgpack")
    members = await liveness.fleet()
    assert [m.owner for m in members] == [b, a]  # sorted by host: "host-b" < "host:a"
    second, first = members
    assert (first.confirmed_ms, first.lapsed, first.started_ms, first.runs) == (100, False, 50, 3)
    assert first.queues == ("default", "high")
    assert first.info == {"ver": "1"}
    assert 0 < first.ttl_ms <= 3_000
    assert first.suspect is None and first.live  # no database time given: only TTLs judged
    assert (second.lapsed, second.started_ms, second.queues, second.runs) == (True, None, (), None)


def test_host_id_is_required(redis: Redis) -> None:
    with pytest.raises(ValueError):
        Liveness(redis, "p", "")
