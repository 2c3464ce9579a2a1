"""TLS, tested: Postgres with sslmode=verify-full and Redis over rediss:// against servers
that speak only TLS, with their own CA; a wrong CA or a wrong host name is refused with one
clear line, never a traceback.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

import tests.tls.flows as flows
from runfleet.broker.client import connect
from runfleet.ops.models import DoctorView
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.process import Worker
from tests.ops.conftest import invoke
from tests.servers.tls import TlsPostgres, TlsRedis
from tests.tls.conftest import Pki


def _settings(database_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        redis_prefix=f"rft-tls-{uuid.uuid4().hex[:8]}",
        heartbeat_interval=0.2,
        stale_after=1.0,
        sweep_interval=0.2,
    )


def _env(cfg: Settings) -> dict[str, str]:
    return {
        "RUNFLEET_DATABASE_URL": cfg.database_url,
        "RUNFLEET_REDIS_URL": cfg.redis_url,
        "RUNFLEET_REDIS_PREFIX": cfg.redis_prefix,
        "COLUMNS": "400",
    }


async def test_postgres_refuses_a_client_without_tls(tls_postgres: TlsPostgres) -> None:
    """The server admits TLS only, so every other test here that connects used TLS."""
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        await psycopg.AsyncConnection.connect(tls_postgres.url_for(sslmode="disable"))


async def test_store_queue_and_worker_over_verified_tls(
    tls_postgres: TlsPostgres, tls_redis: TlsRedis
) -> None:
    cfg = _settings(tls_postgres.url, tls_redis.url)
    assert "sslmode=verify-full" in cfg.database_url and cfg.redis_url.startswith("rediss://")
    store = await Store.open(cfg)
    try:
        async with store.db.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            )
            row = await cur.fetchone()
        assert row is not None and row["ssl"] is True and row["version"].startswith("TLS")
    finally:
        await store.close()

    redis = connect(cfg)  # the broker's own client builder: URL options pass through
    try:
        assert await redis.ping()
        kwargs = redis.connection_pool.connection_kwargs
        assert kwargs["ssl_ca_certs"] == str(tls_redis.tls.ca)
        assert kwargs["ssl_cert_reqs"] == "required"
    finally:
        await redis.aclose()

    worker = Worker(cfg, queues=["default"], concurrency=4)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.started.wait(), 15)
        async with AsyncQueue("default", settings=cfg) as queue:
            runs = [await queue.enqueue(flows.squared, i) for i in range(5)]
            assert [await r.result(timeout=20) for r in runs] == [i * i for i in range(5)]
    finally:
        worker.stop(hard=True)
        await asyncio.wait_for(task, 15)

    doctor = await invoke(_env(cfg), "doctor", "--json")
    view = DoctorView.model_validate_json(doctor.stdout)
    checks = {c.name: c.status for c in view.checks}
    assert checks["postgres"] == "ok" and checks["redis"] == "ok", doctor.stdout


async def test_postgres_wrong_ca_or_host_is_refused(tls_postgres: TlsPostgres, pki: Pki) -> None:
    cases = {
        "certificate verify failed": tls_postgres.url_for(ca=pki.rogue_ca),
        'does not match host name "127.0.0.1"': tls_postgres.url_for(host="127.0.0.1"),
    }
    for reason, url in cases.items():
        with pytest.raises(psycopg.OperationalError, match=reason):
            await psycopg.AsyncConnection.connect(url, connect_timeout=5)
        env = _env(_settings(url, "redis://127.0.0.1:1/0"))
        result = await invoke(env, "doctor")
        assert result.code == 1 and result.clean, result.exception
        line = next(ln for ln in result.stdout.splitlines() if ln.lstrip().startswith("postgres"))
        assert reason in line and "Traceback" not in result.stdout + result.stderr
        runs = await invoke(env, "runs")
        assert runs.code == 1 and runs.clean
        assert reason in runs.stderr and len(runs.stderr.strip().splitlines()) == 1


async def test_redis_wrong_ca_or_host_is_refused(tls_redis: TlsRedis, pki: Pki) -> None:
    cases = {
        "certificate verify failed": tls_redis.url_for(ca=pki.rogue_ca),
        "IP address mismatch": tls_redis.url_for(host="127.0.0.1"),
    }
    for reason, url in cases.items():
        client: Redis = connect(url)
        try:
            with pytest.raises(RedisConnectionError, match=reason):
                await client.ping()
        finally:
            await client.aclose()
        result = await invoke(_env(_settings("postgresql://127.0.0.1:1/x", url)), "doctor")
        assert result.code == 1 and result.clean, result.exception
        line = next(ln for ln in result.stdout.splitlines() if ln.lstrip().startswith("redis"))
        assert reason in line and "Traceback" not in result.stdout + result.stderr
