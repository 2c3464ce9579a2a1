"""The same 300 five-step flows while Redis restarts empty, or answers only errors
(OOM under ``maxmemory 1``, then READONLY as a replica of nothing) for a while.

Redis carries hints only (wakes, liveness, notifications): no run may fail, be lost
or settle twice for it; sweeps over Postgres cover every lost wake.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.store.config import Settings
from tests.chaos.conftest import chaos_settings
from tests.chaos.harness import assert_clean, run_scenario

pytestmark = pytest.mark.chaos
ERROR_SECONDS = 10.0


async def test_redis_restart(
    settings: Settings, own_redis: ThrowawayRedis, ledger_url: str
) -> None:
    """Restarted with persistence off: streams, groups and liveness keys are gone."""
    ours = chaos_settings(settings, redis_url=own_redis.url)
    outcome = await run_scenario(ours, ledger_url, lambda: asyncio.to_thread(own_redis.restart))
    assert_clean(outcome)


async def test_redis_answering_errors(
    settings: Settings, own_redis: ThrowawayRedis, ledger_url: str
) -> None:
    """OOM replies to every write, then READONLY to every write, then healthy again."""
    ours = chaos_settings(settings, redis_url=own_redis.url)
    client = aioredis.Redis.from_url(own_redis.url)
    seen: list[str] = []

    async def refuse_writes() -> None:
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")
        seen.append(await _write_error(client))
        await asyncio.sleep(ERROR_SECONDS / 2)
        await client.config_set("maxmemory", "0")
        await client.execute_command("REPLICAOF", "127.0.0.1", "1")  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
        seen.append(await _write_error(client))
        await asyncio.sleep(ERROR_SECONDS / 2)
        await client.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated

    try:
        outcome = await run_scenario(ours, ledger_url, refuse_writes)
    finally:
        await client.aclose()
    assert seen == ["OutOfMemoryError", "ReadOnlyError"], seen
    assert_clean(outcome)


async def _write_error(client: aioredis.Redis) -> str:
    try:
        await client.set("chaos:probe", "x")
    except Exception as exc:
        return type(exc).__name__
    return "accepted"
