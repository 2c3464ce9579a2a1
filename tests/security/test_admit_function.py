"""runfleet.admit (one statement per admission) holds a producer to every rule raw SQL meets,
and so does runfleet.admit_one (0022), the single enqueue's entry point: every test of a
raw call here runs on both (``entry``).

The function is SECURITY INVOKER: its INSERTs are the caller's, so row-level security,
the restrictive policies of migration 0013 (reserved ids, size caps, the database's
clock), column privileges and the journal's writer all apply exactly as to a raw INSERT.
Called raw with a producer's credentials, it refuses what the raw INSERT refuses; through
the Queue it admits what the producer may, recording the producer as the writer.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runfleet.producer import AsyncQueue
from runfleet.rqface import Queue
from runfleet.store.queries import q
from runfleet.store.roles import GroupRole
from tests.security.conftest import Login, MakeLogin


def _run(run_id: str, scopes: list[str], payload: str = '{"args": [], "kwargs": {}}') -> Any:
    return {
        "id": run_id, "flow": "sec.leaf", "queue": "default", "state": {"scopes": scopes},
        "payload": payload, "lineage_id": run_id, "round_ordinal": 0,
        "previous_round_id": None, "delay_until_ms": None, "timeout_ms": None,
    }  # fmt: skip


@pytest.fixture(params=["batch", "one"])
def entry(request: pytest.FixtureRequest) -> str:
    """Which function a raw call goes through: runfleet.admit or runfleet.admit_one."""
    return str(request.param)


async def _admit(who: Login, runs: list[Any], entry: str = "batch") -> list[Any]:
    records = [
        {"id": r["id"], "source_seq": i + 1, "record": {}, "digest": "d"}
        for i, r in enumerate(runs)
    ]
    if entry == "one":
        assert len(runs) == 1
        run = {"priority": None, "dedup_key": None, **runs[0]}
        params = {**run, **records[0], "state": Jsonb(run["state"]),
                  "record": Jsonb(records[0]["record"])}  # fmt: skip
    else:
        params = {"runs": Jsonb(runs), "records": Jsonb(records)}
    params |= {"kind": "created", "source_id": f"raw-{who.name}"}
    async with await psycopg.AsyncConnection.connect(
        who.url, autocommit=True, row_factory=dict_row
    ) as conn:
        cur = await conn.execute(q(f"admit.{entry}"), params)
        return await cur.fetchall()


async def test_raw_calls_meet_the_policies_a_raw_insert_meets(login: MakeLogin, entry: str) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    with pytest.raises(psycopg.errors.CheckViolation, match="reserved for derived ids"):
        await _admit(me, [_run("victim/child:sec.leaf#1", ["s1"])], entry)
    with pytest.raises(psycopg.errors.CheckViolation, match="reserved for derived ids"):
        await _admit(me, [_run("victim@1", ["s1"])], entry)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        await _admit(me, [_run("other-tenant", ["s2"])], entry)  # a scope it was not granted
    big = json.dumps({"args": ["x" * 1_100_000], "kwargs": {}})
    with pytest.raises(psycopg.errors.CheckViolation, match="payload"):
        await _admit(me, [_run("too-big", ["s1"], big)], entry)
    with pytest.raises(psycopg.errors.CheckViolation, match="requeue of a failed round"):
        await _admit(me, [_run("r@1", ["s1"]) | {"lineage_id": "r", "round_ordinal": 1}], entry)
    if entry == "batch":  # All or nothing: one refused run refuses the statement.
        with pytest.raises(psycopg.errors.CheckViolation):
            await _admit(me, [_run("fine", ["s1"]), _run("x@2", ["s1"])])
    rows = await _admit(me, [_run("fine", ["s1"])], entry)
    assert [(r["id"], r["inserted"]) for r in rows] == [("fine", True)]
    again = await _admit(me, [_run("fine", ["s1"])], entry)  # joined: the run, no new record
    assert [(r["id"], r["inserted"]) for r in again] == [("fine", False)]
    async with await psycopg.AsyncConnection.connect(me.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*), array_agg(DISTINCT writer::text) FROM runfleet.journal"
            " WHERE run_id = 'fine'"
        )
        assert await cur.fetchone() == (1, [me.name])  # the writer is the session's role


async def test_another_tenants_run_is_neither_joined_nor_shown(
    login: MakeLogin, entry: str
) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    other = await login(GroupRole.PRODUCER, "s2")
    await _admit(owner, [_run("mine", ["s1"])], entry)
    rows = await _admit(other, [_run("mine", ["s2"])], entry)  # taken, by a run it cannot see
    assert rows == []
    async with await psycopg.AsyncConnection.connect(owner.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*), array_agg(DISTINCT writer::text) FROM runfleet.journal"
            " WHERE run_id = 'mine'"
        )
        assert await cur.fetchone() == (1, [owner.name])


async def test_the_queue_admits_through_it_as_the_producer(login: MakeLogin) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"], late_binding=True) as aq:
        run = await aq.enqueue("sec.leaf", job_id="async-one")
        assert list((await run.fetch()).scopes) == ["s1"]
    with Queue("default", settings=me.settings, scopes=["s1"], late_binding=True) as queue:
        job = queue.enqueue("sec.leaf", job_id="sync-one")  # driven in this thread
        assert job.get_status().value == "queued"
    async with await psycopg.AsyncConnection.connect(me.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT run_id, kind, writer::text FROM runfleet.journal ORDER BY run_id"
        )
        assert await cur.fetchall() == [
            ("async-one", "created", me.name),
            ("sync-one", "created", me.name),
        ]
