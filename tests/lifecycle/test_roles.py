"""Events and messages under the least-privilege roles: Postgres holds every line."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import tests.lifecycle.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store.errors import RunNotFound, ScopeDenied
from runfleet.store.events import MessageSent
from runfleet.store.roles import GroupRole
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.security.conftest import MakeLogin


async def test_a_producer_sends_and_reads_only_what_its_scopes_cover(login: MakeLogin) -> None:
    fleet = await login(GroupRole.WORKER)
    owner = await login(GroupRole.PRODUCER, "s1")
    intruder = await login(GroupRole.PRODUCER, "s2")
    w = Worker(fleet.settings, queues=["default"], concurrency=4)
    task = asyncio.create_task(w.run())
    try:
        async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
            run = await q.enqueue(flows.progress)
            assert await q.get_event(run.id, "stage", timeout=20) == {"n": 1}
            async with AsyncQueue("default", settings=intruder.settings, scopes=["s2"]) as other:
                with pytest.raises((RunNotFound, ScopeDenied)):
                    await other.send(run.id, "go", "forged")
                # another scope's run reads as no run at all (DBOS's answer for an unknown id)
                assert await other.get_event(run.id, "stage") is None
            assert w.store is not None
            await parked(w.store, run.id, "event", timeout=20)
            async with await psycopg.AsyncConnection.connect(intruder.url, autocommit=True) as c:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):  # row-level security
                    await c.execute(
                        "INSERT INTO runfleet.run_messages (run_id, topic, value, digest,"
                        " sent_at_ms) VALUES (%s, 'go', '1', 'x', 0)",
                        (run.id,),
                    )
                cur = await c.execute(
                    "SELECT count(*) FROM runfleet.run_events WHERE run_id = %s", (run.id,)
                )
                assert await cur.fetchone() == (0,)
            async with await psycopg.AsyncConnection.connect(owner.url, autocommit=True) as c:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await c.execute(
                        "UPDATE runfleet.run_messages SET consumed_at_ms = 1 WHERE run_id = %s",
                        (run.id,),
                    )
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await c.execute(
                        "INSERT INTO runfleet.run_events (run_id, key, value, digest, version,"
                        " set_at_ms) VALUES (%s, 'stage', '0', 'x', 9, 0)",
                        (run.id,),
                    )
                with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the payload cap
                    await c.execute(
                        "INSERT INTO runfleet.run_messages (run_id, topic, value, digest,"
                        " sent_at_ms) VALUES (%s, 'go', to_json(repeat('x', 2000000)), 'x', 0)",
                        (run.id,),
                    )
            assert isinstance(await q.send(run.id, "go", "real"), MessageSent)
            assert await run.result(timeout=20) == "done"
    finally:
        w.stop(hard=True)
        await asyncio.wait_for(task, 15)
