"""The liveness probe at its edges (real Redis, real processes): the bounds it derives from
the fleet's settings, the pid states it reads, the exact suspicion thresholds, the detail it
reports, and what it counts and logs when Redis misbehaves. Written against the mutants
``make mutate MODULE=broker/liveness.py`` found surviving.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import msgpack
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

import runfleet.broker.liveness as liveness_module
from runfleet.broker.client import connect
from runfleet.broker.keys import Keys
from runfleet.broker.liveness import Liveness, _pid_state
from runfleet.broker.liveness_keys import Beat, KeyRead
from runfleet.store.config import Settings
from runfleet.store.types import Owner

HB = 1_764_000_000_000


def nonce() -> str:
    return uuid.uuid4().hex[:12]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def silent_redis() -> AsyncIterator[Redis]:
    """A server that accepts connections and never answers (a silently dropped link)."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    client = connect(f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0")
    try:
        yield client
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


# ---- the bounds follow the settings -------------------------------------------------


def test_bad_arguments_are_refused_with_the_reason(redis: Redis) -> None:
    with pytest.raises(ValueError, match=r"^host_id is required: the probe branches on same"):
        Liveness(redis, "p", "")
    for interval in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"^heartbeat_interval must be positive$"):
            Liveness(redis, "p", "h", heartbeat_interval=interval)


def test_unset_bounds_follow_the_fleets_rules_and_set_ones_are_kept(redis: Redis) -> None:
    derived = Liveness(redis, "p", "h", heartbeat_interval=0.2)
    fleet = Settings.model_construct(heartbeat_interval=0.2, stale_after=1.0)
    assert derived.tolerance_ms == 400, "two intervals"
    assert Liveness(redis, "p", "h", heartbeat_interval=1.0).tolerance_ms == 2000
    assert derived.stale_after_ms == 1000, "five intervals when unset"
    assert derived.key_ttl_ms == int(fleet.liveness_ttl * 1000)
    assert derived.max_ttl_ms == 10 * derived.key_ttl_ms
    assert derived.timeout == fleet.liveness_timeout
    given = Liveness(redis, "p", "h", heartbeat_interval=0.2, stale_after=3, key_ttl=7, timeout=2)
    assert (given.stale_after_ms, given.key_ttl_ms, given.timeout) == (3000, 7000, 2)


async def test_for_settings_carries_every_setting(
    redis: Redis, redis_prefix: str, settings: Settings
) -> None:
    tuned = settings.model_copy(
        update={"heartbeat_interval": 0.3, "stale_after": 2.0, "host_id": "tuned-host"}
    )
    live = Liveness.for_settings(redis, tuned)
    assert live.host_id == "tuned-host"
    assert live.tolerance_ms == 600 and live.stale_after_ms == 2000
    assert live.key_ttl_ms == int(tuned.liveness_ttl * 1000)
    assert live.timeout == tuned.liveness_timeout
    owner = Owner("elsewhere", 77, nonce())
    await live.refresh(owner, HB, False)
    assert await redis.exists(Keys(redis_prefix).alive(owner)) == 1, "under the fleet's prefix"


# ---- pids on this host ---------------------------------------------------------------


def test_pid_states(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _pid_state(os.getpid()) == "running"
    # pid 1 is a process (init), not a group. Asked through a stand-in for os.kill: a
    # mutant that sends a real signal must never reach the machine's init process.
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: asked.append((pid, sig)))
    assert _pid_state(1) == "running", "pid 1 is a process (init), not a group"
    assert asked == [(1, 0)], "the probe asks with signal 0, delivering nothing"
    monkeypatch.undo()
    for pid in (0, -1, -os.getpid(), 2**40):  # groups, and a pid the kernel cannot hold
        assert _pid_state(pid) == "gone"


CATCHES_SIGNALS = """
import signal, sys
got = []
for number in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(number, lambda n, _frame: got.append(n))
print("ready", flush=True)
sys.stdin.readline()
print(",".join(map(str, got)) or "none", flush=True)
"""


def test_probing_a_live_pid_delivers_it_no_signal() -> None:
    """The probe asks the kernel about a pid (signal 0); it must never signal the owner.

    The child catches the signals a wrong probe could send and reports what it got: a
    signal sent before the report is asked for is handled before the child reads it.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", CATCHES_SIGNALS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        assert _pid_state(child.pid) == "running"
        child.stdin.write("report\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "none", "the probe signalled the owner"
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_zombie_whose_name_holds_a_parenthesis_is_still_a_zombie() -> None:
    """``/proc/<pid>/stat`` is ``pid (comm) state``: comm may itself contain ``)``."""
    pid = os.fork()
    if pid == 0:  # the child names itself "a) R (b" and exits at once, unreaped
        libc = ctypes.CDLL(None)
        libc.prctl(15, b"a) R (b", 0, 0, 0)  # PR_SET_NAME
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while _pid_state(pid) != "zombie" and time.monotonic() < deadline:
            time.sleep(0.01)  # a deadline-bounded wait for the child to exit
        with open(f"/proc/{pid}/stat", "rb") as fh:
            assert b"(a) R (b)" in fh.read()
        assert _pid_state(pid) == "zombie"
    finally:
        os.waitpid(pid, 0)


async def test_probe_detail_names_the_pid_on_this_host_only(
    liveness: Liveness, host_id: str
) -> None:
    gone = Owner(host_id, 2**40, nonce())
    probe = await liveness.probe(gone, HB)
    assert probe.detail == {"pid": 2**40, "pid_state": "gone"}
    reused = Owner(host_id, os.getpid(), nonce())  # running pid, no key for this nonce
    probe = await liveness.probe(reused, HB)
    assert (probe.evidence, probe.detail) == (
        "same-host-pid-reused",
        {"pid": os.getpid(), "key": "absent"},
    )
    elsewhere = Owner("elsewhere", 4242, nonce())
    await liveness.refresh(elsewhere, HB, True)
    probe = await liveness.probe(elsewhere, HB)
    assert probe.evidence == "owner-lapsed"
    assert probe.detail["key"] == "lapsed" and probe.detail["confirmed_ms"] == HB
    assert "pid" not in probe.detail
    mine = Owner(host_id, os.getpid(), nonce())
    await liveness.refresh(mine, HB, True)
    probe = await liveness.probe(mine, HB)
    assert probe.evidence == "owner-lapsed" and probe.detail["pid"] == os.getpid()
    assert probe.detail["key"] == "lapsed"


# ---- writes are bounded; TTLs are what was asked -------------------------------------


async def test_refresh_sets_the_ttl_it_is_given(redis: Redis, liveness: Liveness) -> None:
    owner = Owner("elsewhere", 5, nonce())
    await liveness.refresh(owner, HB, False, ttl_s=40)
    ttl = await redis.pttl(Keys(liveness._keys.prefix).alive(owner))
    assert 30_000 < ttl <= 40_000
    await liveness.refresh(owner, HB, False)
    ttl = await redis.pttl(Keys(liveness._keys.prefix).alive(owner))
    assert 0 < ttl <= liveness.key_ttl_ms


async def test_refresh_and_clear_honour_an_explicit_timeout(
    silent_redis: Redis, redis_prefix: str
) -> None:
    live = Liveness(silent_redis, redis_prefix, "h", heartbeat_interval=1.0, timeout=5.0)
    owner = Owner("elsewhere", 6, nonce())
    calls: list[Callable[[], Awaitable[None]]] = [
        lambda: live.refresh(owner, HB, False, timeout=0.1),
        lambda: live.clear(owner, timeout=0.1),
    ]
    for call in calls:
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await call()
        assert time.monotonic() - began < 1.0, "the explicit bound, not the 5 s default"
    short = Liveness(silent_redis, redis_prefix, "h", heartbeat_interval=1.0, timeout=0.1)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        await short.clear(owner)
    assert time.monotonic() - began < 1.0, "clear is bounded by default too"


async def test_clear_removes_the_key(redis: Redis, liveness: Liveness) -> None:
    owner = Owner("elsewhere", 7, nonce())
    await liveness.refresh(owner, HB, False)
    await liveness.clear(owner)
    assert (await liveness.probe(owner, HB)).detail["key"] == "absent"


# ---- Redis misbehaving: counted, logged, and said ------------------------------------


async def test_a_silent_redis_is_counted_logged_and_said(
    silent_redis: Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.broker.liveness")
    live = Liveness(silent_redis, redis_prefix, "h", heartbeat_interval=0.2)
    owner = Owner("elsewhere", 8, nonce())
    before = sample(
        "runfleet_broker_redis_errors_total", component="liveness-probe", reply="timeout"
    )
    probe = await live.probe(owner, HB)
    assert probe.detail == {
        "key": "unverified",
        "redis": "unreachable",
        "error": f"no answer in {live.timeout}s",
    }
    after = sample(
        "runfleet_broker_redis_errors_total", component="liveness-probe", reply="timeout"
    )
    assert after == before + 1
    (line,) = [r for r in caplog.records if r.getMessage() == "liveness.probe_failed"]
    assert line.__dict__["key"] == Keys(redis_prefix).alive(owner)
    assert "TimeoutError" in line.__dict__["error"]


async def test_an_unreachable_redis_is_counted_logged_and_said(
    dead_redis: Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.broker.liveness")
    live = Liveness(dead_redis, redis_prefix, "h", heartbeat_interval=1.0)
    owner = Owner("elsewhere", 9, nonce())
    before = sample(
        "runfleet_broker_redis_errors_total", component="liveness-probe", reply="unreachable"
    )
    probe = await live.probe(owner, HB)
    assert (probe.detail["key"], probe.detail["redis"]) == ("unverified", "unreachable")
    assert "Connection" in str(probe.detail["error"])
    (line,) = [r for r in caplog.records if r.getMessage() == "liveness.probe_failed"]
    assert line.__dict__["key"] == Keys(redis_prefix).alive(owner)
    assert "ConnectionError" in line.__dict__["error"], "the cause itself, not a wrapper"
    after = sample(
        "runfleet_broker_redis_errors_total", component="liveness-probe", reply="unreachable"
    )
    assert after == before + 1, "counted under the liveness-probe component"


async def test_a_malformed_key_is_dropped_counted_and_logged_by_probe_and_fleet(
    redis: Redis, liveness: Liveness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.broker.liveness")
    owner = Owner("elsewhere", 10, nonce())
    key = Keys(liveness._keys.prefix).alive(owner)
    await redis.set(key, b"\xc1 not msgpack", px=3000)
    before = sample("runfleet_hostile_input_total", channel="liveness")
    assert (await liveness.probe(owner, HB)).detail["key"] == "malformed"
    assert sample("runfleet_hostile_input_total", channel="liveness") == before + 1
    from runfleet.broker import hostile

    hostile.rate_limited.reset()
    assert await liveness.fleet() == []
    assert sample("runfleet_hostile_input_total", channel="liveness") == before + 2
    lines = [r for r in caplog.records if r.getMessage() == "liveness.malformed"]
    assert len(lines) == 2 and all(r.__dict__["key"] == key for r in lines)
    assert all(r.__dict__["channel"] == "liveness" for r in lines)
    probed, listed = (r.__dict__["reason"] for r in lines)
    assert probed == listed != "None", "by either path, the judge's error, not a missing one"


# ---- the fleet view ------------------------------------------------------------------


async def test_fleet_members_keep_only_well_typed_info_and_a_zero_ttl_floor(
    redis: Redis, liveness: Liveness
) -> None:
    now = int(time.time() * 1000)
    typed = Owner("host-t", 11, nonce())
    await liveness.refresh(typed, now, False, info={"started_ms": now - 5, "runs": 3})
    loose = Owner("host-l", 12, nonce())
    await liveness.refresh(loose, now, False, info={"started_ms": "yesterday", "runs": "3"})
    untimed = Owner("host-u", 13, nonce())
    value = msgpack.packb({"confirmed_ms": now, "lapsed": False})
    await redis.set(Keys(liveness._keys.prefix).alive(untimed), value)
    members = {m.host: m for m in await liveness.fleet(now)}
    assert (members["host-t"].started_ms, members["host-t"].runs) == (now - 5, 3)
    assert (members["host-l"].started_ms, members["host-l"].runs) == (None, None)
    assert members["host-u"].ttl_ms == 0 and members["host-u"].suspect == "key without TTL"
    assert 0 < members["host-t"].ttl_ms <= liveness.key_ttl_ms


def test_suspicion_thresholds_are_exact_and_say_by_how_much(redis: Redis) -> None:
    live = Liveness(redis, "p", "h", heartbeat_interval=1.0)
    now = 10_000_000
    fine = Beat(confirmed_ms=now, lapsed=False, info={})
    assert live._suspicion(live.max_ttl_ms, fine, now) is None, "at the cap is still plausible"
    assert live._suspicion(live.max_ttl_ms + 1, fine, now) is not None
    edge = Beat(confirmed_ms=now + live.tolerance_ms, lapsed=False, info={})
    assert live._suspicion(1000, edge, now) is None, "within the tolerance is not the future"
    ahead = Beat(confirmed_ms=now + live.tolerance_ms + 1, lapsed=False, info={})
    assert live._suspicion(1000, ahead, now) == (
        f"lease confirmed {live.tolerance_ms + 1} ms in the future"
    )
    old_edge = Beat(confirmed_ms=now - live.stale_after_ms, lapsed=False, info={})
    assert live._suspicion(1000, old_edge, now) is None, "stale only past stale_after"
    old = Beat(confirmed_ms=now - live.stale_after_ms - 1, lapsed=False, info={})
    assert live._suspicion(1000, old, now) == (
        f"lease confirmed {live.stale_after_ms + 1} ms ago, yet not lapsed "
        f"(a live worker lapses before {live.stale_after_ms} ms)"
    )
    assert live._suspicion(1000, old, None) is None, "no database time: no age judged"


async def test_a_key_that_expires_between_scan_and_read_is_skipped_quietly(
    redis: Redis, liveness: Liveness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCAN saw the key, the read found it gone (PTTL -2, injected: the race is a few
    microseconds wide): not a member, and not counted as hostile input either."""
    owner = Owner("host-x", 14, nonce())
    await liveness.refresh(owner, HB, False)

    async def expired(_redis: Redis, keys: list[str | bytes]) -> list[KeyRead]:
        return [KeyRead(ttl_ms=-2, size=0, raw=b"") for _ in keys]

    monkeypatch.setattr(liveness_module, "read_keys", expired)
    before = sample("runfleet_hostile_input_total", channel="liveness")
    assert await liveness.fleet() == []
    assert sample("runfleet_hostile_input_total", channel="liveness") == before
