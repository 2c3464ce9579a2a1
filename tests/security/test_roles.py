"""Each role does its job and nothing else: worker end to end, producer within its scopes,
operator read-only, grants and revokes effective at the next statement."""

from __future__ import annotations

import psycopg
import pytest

from runfleet.producer import AsyncQueue, RunNotFound
from runfleet.store.roles import GroupRole
from runfleet.store.types import EventCompleted, RunStatus
from runfleet.worker.process import Worker
from tests.security.conftest import MakeLogin
from tests.support.polling import until

pytestmark = pytest.mark.usefixtures("role_worker")


async def _status(q: AsyncQueue, run_id: str) -> RunStatus | None:
    try:
        return await q.run(run_id).get_status()
    except RunNotFound:
        return None


async def waiting_for_event(q: AsyncQueue, run_id: str) -> None:
    async def check() -> bool:
        row = await q.store.runs.get(run_id)
        return bool(row and row.waiting and row.waiting.reason == "event")

    await until(check, 15, f"run {run_id} to wait for its event")


async def test_worker_role_runs_a_flow_end_to_end_for_a_scoped_producer(
    login: MakeLogin, role_worker: Worker
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", "hi", run_id="full-1")
        await waiting_for_event(q, run.id)
        assert isinstance(await q.complete(run.id, "go", {"ok": True}), EventCompleted)
        assert await run.result(timeout=20) == {"upper": "HI", "kid": 42, "answer": {"ok": True}}
        # The child inherited the parent's scopes, so the producer sees it too.
        edges = await q.store.dag.children(run.id)
        assert len(edges) == 1
        kid = await q.run(edges[0].child_id).fetch()
        assert kid.scopes == ("s1",) and kid.status is RunStatus.COMPLETED
        cancelled = await q.enqueue("sec.full", "bye", run_id="full-2")
        await waiting_for_event(q, cancelled.id)
        await q.cancel(cancelled.id)
        await until(lambda: _cancelled(q, cancelled.id), 15, "the cancel to settle")


async def _cancelled(q: AsyncQueue, run_id: str) -> bool:
    return await _status(q, run_id) is RunStatus.CANCELLED


async def _quarantined(q: AsyncQueue, admin_url: str, run_id: str) -> None:
    """Park a run of the producer's on quarantine: its recorded step output is damaged
    (written behind the code's back, standing for disk or operator damage)."""
    await q.enqueue("sec.full", "hi", run_id=run_id)
    await waiting_for_event(q, run_id)
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE runfleet.steps SET output = '\"DAMAGED\"' WHERE run_id = %s AND name = 'upper'",
            (run_id,),
        )
    await q.complete(run_id, "go", 1)

    async def check() -> bool:
        row = await q.store.runs.get(run_id)
        return bool(row and row.waiting and row.waiting.reason == "quarantine")

    await until(check, 15, f"run {run_id} to be quarantined")


async def test_the_producer_resumes_its_quarantined_runs(
    database_url: str, login: MakeLogin, role_worker: Worker
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        await _quarantined(q, database_url, "accept")
        await q.resume("accept", accept_recorded=True, actor="ops")
        assert (await q.run("accept").result(timeout=20))["upper"] == "DAMAGED"
        await _quarantined(q, database_url, "rerun")
        step = [s.key for s in await q.store.steps.of_run("rerun") if "upper" in s.key]
        await q.resume("rerun", rerun_step=step[0], actor="ops")
        assert (await q.run("rerun").result(timeout=20))["upper"] == "HI"
