"""The size caps hold against raw SQL with a producer's own credentials.

``RUNFLEET_MAX_PAYLOAD_BYTES`` (1 MB) bounded payloads, meta, answers and results only in
Python: a producer's INSERT could store a 3 MB payload, and a raw call of runfleet.answer
a 3 MB answer, which a shared worker then loads. The database now holds producers to
``runfleet.limits`` (written by ``runfleet roles --apply`` from its settings); the API
still refuses first, with its own typed error.
"""

from __future__ import annotations

import json
from typing import Any, LiteralString

import psycopg
import pytest

from runfleet.producer import AsyncQueue, EventCompleted
from runfleet.store import roles
from runfleet.store.errors import InvalidInput, LimitExceeded
from runfleet.store.roles import GroupRole
from runfleet.store.values import UnstorableValue
from tests.security.conftest import Login, MakeLogin
from tests.security.test_roles import waiting_for_event

pytestmark = pytest.mark.usefixtures("role_worker")

BIG = "x" * 3_000_000
STATE: LiteralString = '{"scopes": ["s1"]}'


async def _raw(who: Login, query: LiteralString, params: tuple[Any, ...]) -> Any:
    async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchone() if cur.description else None


ADMIT: LiteralString = (
    "INSERT INTO runfleet.runs (id, flow, queue, status, state, payload, lineage_id,"
    " created_at_ms, updated_at_ms) VALUES (%s, 'sec.leaf', 'default', 'pending',"
    " %s::jsonb, %s::json, %s, runfleet.now_ms(), runfleet.now_ms())"
)
ANSWER: LiteralString = (
    "SELECT outcome FROM runfleet.answer(%s, %s, NULL, false, %s::json, NULL, %s, %s,"
    " 'raw-sql', %s)"
)


async def test_raw_sql_cannot_store_more_than_the_caps(login: MakeLogin) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    small = json.dumps({"args": [1], "kwargs": {}})
    oversized: dict[str, tuple[str, str]] = {
        "payload": (json.dumps({"scopes": ["s1"]}), json.dumps({"args": [BIG], "kwargs": {}})),
        "meta": (json.dumps({"scopes": ["s1"], "meta": {"blob": BIG}}), small),
        "description": (json.dumps({"scopes": ["s1"], "description": BIG}), small),
        "result": (json.dumps({"scopes": ["s1"], "result": BIG}), small),
        "state": (json.dumps({"scopes": ["s1"], "junk": [BIG, BIG]}), small),
    }
    for field, (state, payload) in oversized.items():
        with pytest.raises(psycopg.errors.CheckViolation, match=f"runfleet refuses {field}"):
            await _raw(me, ADMIT, (f"big-{field}", state, payload, f"big-{field}"))
            pytest.fail(f"a producer stored a 3 MB {field}")

    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", "x", run_id="asking")
        await waiting_for_event(q, run.id)
    # Growing a run it may update: meta saved later, or anything else in its state.
    for patch in ('{"meta": {"blob": "%s"}}', '{"junk": ["%s", "%s"]}'):
        query = "UPDATE runfleet.runs SET state = state || %s::jsonb WHERE id = 'asking'"
        with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses"):
            await _raw(me, query, (patch.replace("%s", BIG),))
    # An answer through the function itself, and a journal record of its own.
    for value, reason in ((json.dumps(BIG), None), ("1", BIG)):
        with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses"):
            await _raw(me, ANSWER, ("asking", "go", value, reason, 1000, 1))
    with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses payload"):
        await _raw(
            me,
            "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,"
            " at_ms) VALUES ('asking', 'note', 'me', 1, %s::jsonb, 'd', 0)",
            (json.dumps({"blob": BIG}),),
        )
    # Nothing of it landed: the run waits as it did, and takes a real answer.
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        row = await q.store.runs.get("asking")
        assert row is not None and "meta" not in row.state and "junk" not in row.state
        assert await q.store.deferreds.deferred("asking", "go") is None
        assert isinstance(await q.complete("asking", "go", "fine"), EventCompleted)
        assert (await q.run("asking").result(timeout=20))["answer"] == "fine"


async def test_the_api_refuses_first_with_its_typed_errors(
    login: MakeLogin, database_url: str
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        with pytest.raises(UnstorableValue) as payload:
            await q.enqueue("sec.leaf", BIG)
        assert payload.value.field == "payload"
        with pytest.raises(InvalidInput) as meta:
            await q.enqueue("sec.leaf", 1, meta={"blob": BIG})
        assert meta.value.field == "options"
        # Within the cap as compact JSON, past it as Postgres stores it (jsonb writes
        # 1e300 as 301 digits): refused by the API as the database would, typed.
        wide = [1e300] * 20_000
        assert len(json.dumps(wide, separators=(",", ":"))) < 1_000_000
        with pytest.raises(InvalidInput) as stored:
            await q.enqueue("sec.leaf", 1, meta={"wide": wide})
        assert stored.value.field == "meta" and "as stored" in str(stored.value)
        run = await q.enqueue("sec.full", "x", run_id="asking")
        await waiting_for_event(q, run.id)
        with pytest.raises(InvalidInput) as answer:
            await q.complete(run.id, "go", BIG)
        assert answer.value.field == "value"

    # The database's limits tighter than this process's settings: the database refuses,
    # and the API still raises a typed error naming the field.
    await roles.apply_privileges(database_url, limits=roles.Limits(10_000, 2))
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        with pytest.raises(InvalidInput, match="refused by the database") as tight:
            await q.enqueue("sec.leaf", "y" * 20_000)
        assert tight.value.field == "payload"
        with pytest.raises(InvalidInput, match="refused by the database") as tight:
            await q.complete(run.id, "early", "z" * 20_000)
        assert tight.value.field == "value"
        # The answer cap: the smaller of the caller's (1,000 here) and the database's (2).
        assert isinstance(await q.complete(run.id, "early-1", 1), EventCompleted)
        assert isinstance(await q.complete(run.id, "early-2", 2), EventCompleted)
        with pytest.raises(LimitExceeded):
            await q.complete(run.id, "early-3", 3)
    assert await _raw(me, ANSWER, ("asking", "early-4", "4", None, 10**9, 7)) == ("limit",)
