"""Every page and API answer read from a replica carries the lag it was read at.

The replica is stubbed here (the topology reader answers "a standby, 2.5 s behind");
tests/ha/test_read_replica.py proves the same against a real paused streaming replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

import tests.flows.flows as f
from runfleet.ops.dashboard import app as dashboard_app
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.db import Database
from runfleet.store.topology import Role, Topology
from tests.dashboard.conftest import BASE

LAG_S = 2.5
API = ["/api/overview", "/api/runs", "/api/fleet"]
PARTS = ["", "/explain", "/journal", "/tree", "/steps", "/lifecycle"]
PAGES = ["/", "/runs", "/fleet"]


def _seen(role: Role) -> Topology:
    return Topology(
        role=role,
        synchronous_commit="on",
        synchronous_standby_names="",
        standbys=(),
        replay_lag_s=LAG_S if role is Role.STANDBY else None,
        receive_behind_bytes=0,
        upstream=None,
        timeline=1,
    )


@pytest.fixture
async def read_dashboard(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """RUNFLEET_READ_DATABASE_URL set (to the test's database: whatever the stub says)."""
    read = settings.model_copy(update={"read_database_url": settings.database_url})
    app = dashboard_app.create_app(read, allowed_hosts=("testserver",))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client,
    ):
        yield client


async def _answers(client: httpx.AsyncClient, run_id: str) -> dict[str, httpx.Response]:
    paths = [*API, *(f"/api/runs/{run_id}{p}" for p in PARTS), *PAGES, f"/runs/{run_id}"]
    answers = {p: await client.get(p) for p in paths}
    for path, r in answers.items():
        assert r.status_code == 200, (path, r.text)
    return answers


async def test_replica_answers_carry_the_lag_and_primary_answers_do_not(
    queue: AsyncQueue, read_dashboard: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await queue.enqueue(f.steps, "lag")
    role = Role.STANDBY

    async def stub(db: Database) -> Topology:
        return _seen(role)

    monkeypatch.setattr(dashboard_app, "read_topology", stub)

    for path, r in (await _answers(read_dashboard, run.id)).items():
        if path.startswith("/api/"):
            assert r.json()["replica_lag_s"] == LAG_S, path
        else:
            assert "read from a replica: replay lag 2.5 s" in r.text, path

    role = Role.PRIMARY  # the read URL names a primary (after a failover, say): current
    for path, r in (await _answers(read_dashboard, run.id)).items():
        if path.startswith("/api/"):
            assert r.json()["replica_lag_s"] is None, path
        else:
            assert "replica" not in r.text, path
