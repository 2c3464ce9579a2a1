"""A liveness key vouches only while consistent with the lease it claims (real Redis).

Issue 8 item 11: a key with no TTL and a confirmed time from 1970 vouched forever
and blocked every takeover. Each test here writes the key a forger (or a stale
owner) would leave and checks the probe answers "unknown" (the lease decides),
saying truthfully which case applied; and that the one key a live owner writes
still vouches.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import msgpack
import pytest
from redis.asyncio import Redis

from runfleet.broker import hostile
from runfleet.broker.liveness import Liveness
from runfleet.broker.liveness_keys import MAX_VALUE_BYTES
from runfleet.store.types import Owner
from tests.broker.helpers import acl

HB = 1_764_000_000_000
"""The row's last heartbeat (database ms) in these tests."""


def nonce() -> str:
    return uuid.uuid4().hex[:12]


def key_of(prefix: str, owner: Owner) -> str:
    return f"{prefix}:alive:{owner.key}"


def forged(confirmed_ms: int = 0, lapsed: bool = False, **info: object) -> bytes:
    packed: bytes = msgpack.packb({"confirmed_ms": confirmed_ms, "lapsed": lapsed, **info})
    return packed


def owners(host_id: str) -> list[Owner]:
    """One owner on another host and one on this host whose pid is running (ours)."""
    return [Owner("elsewhere", 4242, nonce()), Owner(host_id, os.getpid(), nonce())]


async def test_forged_key_without_ttl_from_1970_does_not_vouch(
    liveness: Liveness, redis: Redis, redis_prefix: str, host_id: str
) -> None:
    for owner in owners(host_id):
        await redis.set(key_of(redis_prefix, owner), forged(0, started_ms=0))
        probe = await liveness.probe(owner, HB)
        assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired"), owner
        assert probe.detail["key"] == "without-ttl"
        assert not probe.vouches


async def test_key_confirmed_long_before_the_heartbeat_does_not_vouch(
    liveness: Liveness, redis: Redis, redis_prefix: str, host_id: str
) -> None:
    # A TTL like a worker's, but a confirmed time from 1970: not this lease's key.
    for owner in owners(host_id):
        await redis.set(key_of(redis_prefix, owner), forged(0), px=3000)
        probe = await liveness.probe(owner, HB)
        assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired")
        assert probe.detail["key"] == "inconsistent"
        assert (probe.detail["confirmed_ms"], probe.detail["heartbeat_at_ms"]) == (0, HB)
        assert probe.detail["tolerance_ms"] == liveness.tolerance_ms


async def test_key_newer_than_the_row_heartbeat_does_not_vouch(
    liveness: Liveness, host_id: str
) -> None:
    # The owner confirmed renewals well after this run's last heartbeat: those renewals
    # did not include the run, so the owner no longer holds it and its key says nothing.
    for owner in owners(host_id):
        later = HB + liveness.tolerance_ms + 1
        await liveness.refresh(owner, later, False)
        probe = await liveness.probe(owner, HB)
        assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired")
        assert (probe.detail["key"], probe.detail["confirmed_ms"]) == ("inconsistent", later)


async def test_fresh_consistent_key_vouches_within_the_tolerance(
    liveness: Liveness, host_id: str
) -> None:
    for owner in owners(host_id):
        for confirmed in (HB - liveness.tolerance_ms, HB, HB + liveness.tolerance_ms):
            await liveness.refresh(owner, confirmed, False)
            probe = await liveness.probe(owner, HB)
            assert probe.vouches, (owner, confirmed, probe)
            assert probe.detail["key"] == "consistent"
    cross, same = owners(host_id)
    await liveness.refresh(cross, HB, False)
    assert (await liveness.probe(cross, HB)).evidence == "cross-host-key-fresh"
    await liveness.refresh(same, HB, False)
    assert (await liveness.probe(same, HB)).evidence == "same-host-pid-alive"


async def test_key_with_an_implausible_ttl_does_not_vouch(
    liveness: Liveness, redis: Redis, redis_prefix: str, host_id: str
) -> None:
    for owner in owners(host_id):
        await redis.set(key_of(redis_prefix, owner), forged(HB), px=liveness.max_ttl_ms + 60_000)
        probe = await liveness.probe(owner, HB)
        assert (probe.verdict, probe.detail["key"]) == ("unknown", "ttl-implausible")


async def test_wrongtype_at_the_liveness_key_is_malformed_and_counted(
    liveness: Liveness, redis: Redis, redis_prefix: str, host_id: str
) -> None:
    before = hostile.HOSTILE_INPUT.labels("liveness")._value.get()
    for owner in owners(host_id):
        await redis.hset(key_of(redis_prefix, owner), "confirmed_ms", HB)
        await redis.pexpire(key_of(redis_prefix, owner), 3000)
        probe = await liveness.probe(owner, HB)
        assert (probe.verdict, probe.evidence) == ("unknown", "lease-expired")
        assert probe.detail["key"] == "malformed"
        assert str(probe.detail["error"]).startswith("WRONGTYPE")
    assert hostile.HOSTILE_INPUT.labels("liveness")._value.get() == before + 2


@pytest.mark.parametrize(
    "value",
    [
        b"\x91" * 200_000,  # msgpack arrays nested 200,000 deep
        b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 billion items
        msgpack.packb({"confirmed_ms": 2**64 - 1, "lapsed": False})[:-1],  # truncated
        msgpack.packb({"confirmed_ms": "1764000000000", "lapsed": False}),  # wrong type
        msgpack.packb({"confirmed_ms": HB, "lapsed": 1}),  # 1 is not a bool
        msgpack.packb({1: 2}),  # a non-str key
        b"\xff" * (MAX_VALUE_BYTES + 1),  # oversized: never read past the cap
        b"",
    ],
    ids=["deep", "huge-header", "truncated", "str-time", "int-lapsed", "int-key", "big", "empty"],
)
async def test_hostile_key_values_are_malformed_never_raised(
    liveness: Liveness, redis: Redis, redis_prefix: str, value: bytes
) -> None:
    owner = Owner("elsewhere", 4242, nonce())
    await redis.set(key_of(redis_prefix, owner), value, px=3000)
    probe = await liveness.probe(owner, HB)
    assert (probe.verdict, probe.detail["key"]) == ("unknown", "malformed")
    assert (await liveness.fleet()) == []  # dropped from the listing too, not raised


async def test_probe_is_bounded_by_its_timeout_against_a_silent_redis(
    redis_prefix: str, host_id: str
) -> None:
    """A server that accepts connections and answers nothing (a silently dropped link)."""
    from runfleet.broker.client import connect

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    silent = connect(f"redis://127.0.0.1:{port}/0")
    try:
        live = Liveness(silent, redis_prefix, host_id, heartbeat_interval=0.2)
        assert live.timeout == pytest.approx(0.1)
        for owner in owners(host_id):
            started = time.monotonic()
            probe = await live.probe(owner, HB)
            elapsed = time.monotonic() - started
            assert (probe.detail["key"], probe.detail["redis"]) == ("unverified", "unreachable")
            assert elapsed < live.timeout + 0.2, elapsed
        cross, same = owners(host_id)
        assert (await live.probe(cross, HB)).verdict == "unknown"
        assert (await live.probe(same, HB)).verdict == "alive"  # documented same-host rule
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await live.refresh(cross, HB, False)  # bounded too, and typed
        assert time.monotonic() - started < live.timeout + 0.2
    finally:
        await silent.aclose()
        server.close()
        await server.wait_closed()


async def test_error_reply_on_the_probe_is_unknown_not_raised(
    redis: Redis, redis_url: str, redis_prefix: str, host_id: str
) -> None:
    """NOPERM (an ACL user that may not run STRLEN): Redis cannot tell, so the lease decides."""
    user = f"rft-{uuid.uuid4().hex[:8]}"
    await acl(redis, "SETUSER", user, "on", "nopass", "~*", "&*", "+@all", "-strlen")
    try:
        from runfleet.broker.client import connect

        base = redis_url.rsplit("/", 1)[0].replace("redis://", f"redis://{user}:x@")
        restricted = connect(f"{base}/0")
        live = Liveness(restricted, redis_prefix, host_id)
        cross, same = owners(host_id)
        await live.refresh(cross, HB, False)
        probe = await live.probe(cross, HB)
        assert (probe.verdict, probe.detail["key"], probe.detail["redis"]) == (
            "unknown",
            "unverified",
            "error-reply",
        )
        # On this host a running pid still vouches while Redis cannot tell (README).
        assert (await live.probe(same, HB)).verdict == "alive"
        await restricted.aclose()
    finally:
        await acl(redis, "DELUSER", user)


async def test_fleet_marks_ghosts_suspect(
    liveness: Liveness, redis: Redis, redis_prefix: str
) -> None:
    now = int(time.time() * 1000)
    real = Owner("host-a", 10, nonce())
    await liveness.refresh(real, now - 200, False, info={"started_ms": now - 60_000})
    no_ttl = Owner("host-b", 20, nonce())
    await redis.set(key_of(redis_prefix, no_ttl), forged(0, started_ms=0))
    from_1970 = Owner("host-c", 30, nonce())
    await redis.set(key_of(redis_prefix, from_1970), forged(0), px=3000)
    future = Owner("host-d", 40, nonce())
    await redis.set(key_of(redis_prefix, future), forged(now + 10**9), px=3000)
    old_but_lapsed = Owner("host-e", 50, nonce())
    await liveness.refresh(old_but_lapsed, now - 60_000, True)
    members = {m.host: m for m in await liveness.fleet(now)}
    assert members["host-a"].suspect is None and members["host-a"].live
    assert members["host-b"].suspect == "key without TTL" and not members["host-b"].live
    assert "ago, yet not lapsed" in str(members["host-c"].suspect)
    assert "in the future" in str(members["host-d"].suspect)
    # A lapsed worker's old confirmed time is what lapsing means: lapsed, not suspect.
    assert members["host-e"].suspect is None and not members["host-e"].live


async def test_concurrent_probes_stay_bounded(liveness: Liveness, host_id: str) -> None:
    """Probing many owners at once: each answers, none raises."""
    probes = await asyncio.gather(
        *(liveness.probe(Owner("elsewhere", i, nonce()), HB) for i in range(1, 51))
    )
    assert {p.detail["key"] for p in probes} == {"absent"}


async def test_fleet_survives_hostile_key_names(
    liveness: Liveness, redis: Redis, redis_prefix: str
) -> None:
    """Key names are Redis data too: a unicode digit pid or non-UTF-8 bytes are skipped."""
    value = forged(int(time.time() * 1000))
    await redis.set(f"{redis_prefix}:alive:h:²:n", value, px=3000)  # "²".isdigit() is True
    await redis.set(f"{redis_prefix}:alive:h:{'9' * 40}:n", value, px=3000)
    await redis.set(f"{redis_prefix}:alive:".encode() + b"\xff\xfe:1:n", value, px=3000)
    members = await liveness.fleet()
    assert [(m.host, m.pid) for m in members] == [("\ufffd\ufffd", 1)]  # read, host mangled
