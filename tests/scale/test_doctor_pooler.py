"""``runfleet doctor`` sees PgBouncer, and warns while prepared statements are on."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from runfleet.ops.cli.doctor import Doctor
from runfleet.ops.servers.postgres import ThrowawayPgBouncer, ThrowawayPostgres
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.pooler import Path, probe
from tests.fleet.procs import ROOT, settings_env


@pytest.fixture(scope="module")
def backend() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def transaction_bouncer(backend: ThrowawayPostgres) -> Iterator[ThrowawayPgBouncer]:
    with ThrowawayPgBouncer(backend) as server:
        yield server


async def _pooler_check(cfg: Settings) -> tuple[str, str]:
    view = await Doctor(cfg, []).run()
    (check,) = [c for c in view.checks if c.name == "pooler"]
    return check.status, check.detail


async def test_direct_connection_is_no_pooler(
    settings: Settings, backend: ThrowawayPostgres
) -> None:
    cfg = settings.model_copy(update={"database_url": backend.url})
    for _ in range(3):  # the verdict must not depend on luck
        assert (await probe(cfg)).path is Path.DIRECT
    status, detail = await _pooler_check(cfg)
    assert status == "ok" and "directly" in detail


async def test_transaction_pooler_warns_while_prepares_are_on(
    settings: Settings, backend: ThrowawayPostgres, transaction_bouncer: ThrowawayPgBouncer
) -> None:
    cfg = settings.model_copy(update={"database_url": transaction_bouncer.url})
    for _ in range(3):
        seen = await probe(cfg)
        assert seen.path is Path.TRANSACTION_POOLER, seen
        assert seen.server_port == backend.port != transaction_bouncer.port
    status, detail = await _pooler_check(cfg.model_copy(update={"prepare_threshold": 5}))
    assert status == "warn" and "RUNFLEET_PREPARE_THRESHOLD" in detail, detail
    status, detail = await _pooler_check(cfg.model_copy(update={"prepare_threshold": None}))
    assert status == "ok" and "transaction pooler" in detail, detail
    pruning = cfg.model_copy(update={"prepare_threshold": None, "retention": 86400.0})
    status, detail = await _pooler_check(pruning)
    assert status == "warn" and "RUNFLEET_RETENTION" in detail, detail


async def test_session_pooler_is_a_middleman(
    settings: Settings, backend: ThrowawayPostgres
) -> None:
    with ThrowawayPgBouncer(backend, pool_mode="session") as bouncer:
        cfg = settings.model_copy(update={"database_url": bouncer.url})
        seen = await probe(cfg)
        assert seen.path is Path.MIDDLEMAN, seen
        assert seen.client_port != seen.local_port


async def test_the_cli_reports_the_pooler(
    settings: Settings, backend: ThrowawayPostgres, transaction_bouncer: ThrowawayPgBouncer
) -> None:
    await migrate(backend.url)
    env = settings_env(settings, database_url=transaction_bouncer.url, prepare_threshold="none")
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "runfleet.ops", "doctor", "--json"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    view = json.loads(done.stdout)
    checks = {c["name"]: c for c in view["checks"]}
    assert checks["pooler"]["status"] == "ok", checks
    assert "transaction pooler" in checks["pooler"]["detail"]
    assert checks["postgres"]["status"] == checks["schema"]["status"] == "ok", checks
