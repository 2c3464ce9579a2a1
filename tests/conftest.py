"""Real-service harness: one Postgres and one Redis per session, a fresh database per test.

Services come from ``ops.servers.resolve.resolve("test")`` (env URLs, Docker, or throwaway local
servers), so the suite runs on a machine with nothing installed but the binaries. Each test
gets its own database cloned from a migrated template and its own Redis key prefix: tests
never see each other's rows or keys, nor those left by an earlier run.

Under pytest-xdist (`make test` runs the suite on several workers) every worker is a
session of its own: it resolves its own services (throwaway servers on free ports, its own
template database), and every name a test makes (database, key prefix, temp dir, worker
log) carries a random token, so workers never meet either. ``tests.support.tiers`` marks
the tests that must run alone (``serial``) and the tiers `make test-fast` leaves out.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import psycopg
import pytest
import redis
import redis.asyncio
from psycopg import sql

from runfleet.ops.servers.resolve import Endpoints, database_url_for, resolve
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.support import tiers
from tests.support.workers import running

if TYPE_CHECKING:
    from runfleet.producer import AsyncQueue
    from runfleet.store import Store
    from runfleet.worker.process import Worker
    from tests.fleet.procs import Spawn

NewDatabase = Callable[[], Awaitable[str]]

# Workers run only registered code: test modules' plain functions (rq-style runs,
# compensations) are allowed as ``--allow-import tests`` would, in-process and in the
# worker processes the tests start (README "Only registered code runs").
os.environ.setdefault("RUNFLEET_ALLOW_IMPORT", "tests")

# pytest-xdist starts its workers with COLUMNS=80 and LINES=24 set. rich fixes a Console's
# width at construction when COLUMNS is set, so the CLI's module-level consoles would print
# 80-column tables whatever width a test asks for (the CLI tests pass COLUMNS=400).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the markers this adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.apply(items)


def _token() -> str:
    return uuid.uuid4().hex[:12]


async def _create_database(admin_url: str, name: str, template: str = "template0") -> str:
    query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(query)
    return database_url_for(admin_url, name)


async def _drop_database(admin_url: str, name: str) -> None:
    # FORCE: a test that failed mid-way may have left connections open (pools, tasks).
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(query)


@pytest.fixture(scope="session")
def services() -> Iterator[Endpoints]:
    endpoints = resolve("test")
    try:
        yield endpoints
    finally:
        endpoints.close()


@pytest.fixture(scope="session")
async def template_database(services: Endpoints) -> AsyncIterator[str]:
    """Name of a database with every migration applied, cloned (cheaply) per test."""
    name = f"rf_tpl_{_token()}"
    url = await _create_database(services.database_url, name)
    try:
        await migrate(url)
        yield name
    finally:
        await _drop_database(services.database_url, name)


@pytest.fixture
async def database_url(services: Endpoints, template_database: str) -> AsyncIterator[str]:
    name = f"rf_t_{_token()}"
    url = await _create_database(services.database_url, name, template=template_database)
    try:
        yield url
    finally:
        await _drop_database(services.database_url, name)


@pytest.fixture
async def new_empty_database(services: Endpoints) -> AsyncIterator[NewDatabase]:
    """Factory of unmigrated databases (for migration tests); all dropped afterwards."""
    names: list[str] = []

    async def create() -> str:
        names.append(f"rf_e_{_token()}")
        return await _create_database(services.database_url, names[-1])

    try:
        yield create
    finally:
        for name in names:
            await _drop_database(services.database_url, name)


@pytest.fixture(scope="session")
def redis_url(services: Endpoints) -> str:
    return services.redis_url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client of the test Redis, as runfleet connects (``broker.client``)."""
    from runfleet.broker.client import connect

    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"rft-{_token()}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    finally:
        client.close()


@pytest.fixture
def settings(database_url: str, redis_url: str, redis_prefix: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        heartbeat_interval=0.2,
        stale_after=1.0,
        sweep_interval=0.2,
    )


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    # Imported here so that the rest of the harness loads even if ``Store`` is broken.
    from runfleet.store import Store

    opened = await Store.open(settings)
    try:
        yield opened
    finally:
        await opened.close()


# ---- fleets: real worker processes, an in-process worker, a producer -----------


@pytest.fixture
async def spawn(settings: Settings) -> AsyncIterator[Spawn]:
    """Start real ``runfleet worker`` processes (keyword arguments override settings)."""
    from tests.fleet.procs import WorkerProc

    started: list[WorkerProc] = []

    def start(**overrides: object) -> WorkerProc:
        proc = WorkerProc(settings, **overrides)  # type: ignore[arg-type]  # the overrides are Settings fields, typed object by the fixture
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[Worker]:
    """A worker running in the test's own event loop (its flows are whatever is imported)."""
    from runfleet.worker.process import Worker

    w = Worker(settings, queues=["default"], concurrency=8)
    async with running(w):
        yield w


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[AsyncQueue]:
    from runfleet.producer import AsyncQueue

    async with AsyncQueue("default", settings=settings) as q:
        yield q
