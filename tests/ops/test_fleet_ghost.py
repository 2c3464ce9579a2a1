"""``runfleet fleet`` does not count a ghost: a forged or leftover liveness key.

A key with no TTL and a confirmed time from 1970 was listed as "up 20787 d" and
satisfied ``fleet --check`` (a container healthcheck) although no worker exists.
"""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.ops.models import FleetView
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from tests.ops.conftest import Cli


async def test_ghost_key_is_suspect_and_does_not_satisfy_fleet_check(
    settings: Settings, cli: Cli
) -> None:
    redis = connect(settings)
    ghost = Owner("ghost-host", 4242, uuid.uuid4().hex[:12])
    try:
        await redis.set(
            f"{settings.redis_prefix}:alive:{ghost.key}",
            msgpack.packb({"confirmed_ms": 0, "lapsed": False, "started_ms": 0, "queues": "q"}),
        )
        check = await cli("fleet", "--check")
        assert check.code == 1 and "no live worker" in check.stderr, check
        raw = await cli("fleet", "--json")
        assert raw.code == 0 and raw.clean, raw
        (member,) = FleetView.model_validate_json(raw.stdout).workers
        assert member.pid == 4242 and member.suspect == "key without TTL"
        text = await cli("fleet")
        assert "SUSPECT" in text.stdout and "key without TTL" in text.stdout, text.stdout
        assert " d" not in text.stdout.split("SUSPECT")[0], text.stdout  # no "up 20787 d"

        # The same ghost with a worker-like TTL: its 1970 confirmation gives it away.
        await redis.pexpire(f"{settings.redis_prefix}:alive:{ghost.key}", 3000)
        assert (await cli("fleet", "--check")).code == 1
        raw = await cli("fleet", "--json")
        (member,) = FleetView.model_validate_json(raw.stdout).workers
        assert "yet not lapsed" in str(member.suspect)

        # A key a live worker writes still passes the healthcheck.
        live = Liveness.for_settings(redis, settings)
        real = Owner("real-host", 77, uuid.uuid4().hex[:12])
        await live.refresh(real, int(time.time() * 1000), False, ttl_s=5)
        assert (await cli("fleet", "--check")).code == 0
        assert (await cli("fleet", "--check", "--host", "ghost-host")).code == 1
    finally:
        await redis.aclose()


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb([1] * 10), b"x" * 100_000])
async def test_fleet_drops_malformed_keys_without_failing(
    settings: Settings, cli: Cli, payload: bytes
) -> None:
    redis = connect(settings)
    try:
        await redis.set(f"{settings.redis_prefix}:alive:h:1:abc", payload, px=5000)
        await redis.hset(f"{settings.redis_prefix}:alive:h:2:def", "a", "b")  # WRONGTYPE
        raw = await cli("fleet", "--json")
        assert raw.code == 0 and raw.clean, raw
        assert FleetView.model_validate_json(raw.stdout).workers == []
    finally:
        await redis.aclose()
