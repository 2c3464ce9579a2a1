"""RUNFLEET_READ_DATABASE_URL against a real streaming replica.

The read commands answer from the replica and say how far it lags; a replica whose
replay is paused shows the past (a run admitted since is not there), which is why the
lag is printed with the answer and why nothing that decides reads it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import psycopg
import pytest

import tests.chaos.flows as cf
from runfleet.ops.dashboard.app import create_app
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.ops.conftest import cli_env, invoke
from tests.servers.patroni import PatroniCluster
from tests.support.polling import until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


async def _has_run(url: str, run_id: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT 1 FROM runfleet.runs WHERE id = %s", (run_id,))
        return await cur.fetchone() is not None


async def _paused(primary_url: str, standby_url: str) -> bool:
    """A pause request takes effect at the next WAL record: write one, then look."""
    async with await psycopg.AsyncConnection.connect(primary_url, autocommit=True) as conn:
        await conn.execute("SELECT txid_current()")
    async with await psycopg.AsyncConnection.connect(standby_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_get_wal_replay_pause_state()")
        row = await cur.fetchone()
    return row is not None and row[0] == "paused"


_RUN = "/api/runs/before-pause"
_APIS = [
    "/api/overview", "/api/runs", "/api/fleet", _RUN, f"{_RUN}/explain", f"{_RUN}/journal",
    f"{_RUN}/tree", f"{_RUN}/steps", f"{_RUN}/lifecycle",
]  # fmt: skip
_PAGES = ["/", "/runs", "/runs/before-pause", "/fleet"]


@asynccontextmanager
async def _dashboard(settings: Settings, read_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        settings.model_copy(update={"read_database_url": read_url}),
        allowed_hosts=("testserver",),
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as client,
    ):
        yield client


async def test_reads_come_from_the_replica_with_its_lag(
    settings: Settings, async_cluster: PatroniCluster
) -> None:
    primary = async_cluster.primary()
    (standby,) = [n for n in async_cluster.nodes if n is not primary]
    ours = settings.model_copy(update={"database_url": async_cluster.url()})
    await migrate(ours.database_url)
    async with AsyncQueue("default", settings=ours) as queue:
        await queue.enqueue(cf.two_steps, "a", run_id="before-pause")
        await until(
            lambda: _has_run(standby.url, "before-pause"), 30, "the replica to replay",
            accept=bool,
        )  # fmt: skip
        await asyncio.to_thread(async_cluster.maintenance, True)  # or Patroni resumes replay
        with psycopg.connect(standby.url, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
        await until(lambda: _paused(primary.url, standby.url), 30, "replay to pause", accept=bool)
        await queue.enqueue(cf.two_steps, "b", run_id="after-pause")
    env = cli_env(ours)
    read = {**env, "RUNFLEET_READ_DATABASE_URL": standby.url}

    from_primary = await invoke(env, "runs", "--json")
    assert {r["id"] for r in json.loads(from_primary.stdout)["runs"]} >= {
        "before-pause",
        "after-pause",
    }
    assert "replica" not in from_primary.stderr

    stale = await invoke(read, "runs", "--json")
    assert stale.code == 0, stale.stderr
    ids = {r["id"] for r in json.loads(stale.stdout)["runs"]}
    assert "before-pause" in ids and "after-pause" not in ids, stale.stderr
    assert "read from a replica (RUNFLEET_READ_DATABASE_URL): replay lag" in stale.stderr

    shown = await invoke(read, "show", "before-pause")
    assert shown.code == 0 and "replay lag" in shown.stderr
    missing = await invoke(read, "show", "after-pause")
    assert missing.code != 0  # the replica has not replayed it yet

    # The dashboard's pages read the replica too, and each says how old it may be.
    async with _dashboard(ours, standby.url) as client:
        overview = (await client.get("/api/overview")).json()
        assert overview["replica_lag_s"] is not None
        assert sum(overview["totals"].values()) == 1  # "after-pause" is not replayed yet
        listing = (await client.get("/api/runs")).json()
        assert [r["id"] for r in listing["runs"]] == ["before-pause"]
        assert (await client.get("/api/runs/after-pause")).status_code == 404
        for path in _APIS:
            answer = await client.get(path)
            assert answer.status_code == 200, (path, answer.text)
            lag = answer.json()["replica_lag_s"]
            assert lag is not None and lag > 0, (path, lag)
        for path in _PAGES:
            page = await client.get(path)
            assert page.status_code == 200, (path, page.text)
            assert "read from a replica: replay lag" in page.text, path
    # RUNFLEET_READ_DATABASE_URL naming the primary (a failover promoted it): current.
    async with _dashboard(ours, primary.url) as client:
        for path in _APIS:
            answer = await client.get(path)
            assert answer.status_code == 200, (path, answer.text)
            assert answer.json()["replica_lag_s"] is None, path
        for path in _PAGES:
            assert "read from a replica" not in (await client.get(path)).text, path

    # Decisions never read the replica: doctor (and every worker) uses database_url.
    doctor = await invoke(read, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["topology"]["detail"].startswith("primary"), checks["topology"]
    on_standby = await invoke({**env, "RUNFLEET_DATABASE_URL": standby.url}, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(on_standby.stdout)["checks"]}
    assert checks["topology"]["status"] == "fail"
    assert checks["topology"]["detail"].startswith("connected to a standby")

    with psycopg.connect(standby.url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_resume()")
    await until(lambda: _has_run(standby.url, "after-pause"), 30, "replay", accept=bool)
    caught_up = await invoke(read, "runs", "--json")
    assert "after-pause" in {r["id"] for r in json.loads(caught_up.stdout)["runs"]}
