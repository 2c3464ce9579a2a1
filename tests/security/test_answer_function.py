"""Answers land only through runfleet.answer (migration 0009): a producer's credentials
cannot write a deferred with raw SQL, so they cannot skip the checks or the journal.

The function is SECURITY DEFINER (row-level security does not apply to it), so it must
refuse a run the caller's grants do not cover exactly as an id never used.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from runfleet.producer import AsyncQueue, EventCompleted
from runfleet.store.deferreds import INTERNAL_PREFIXES
from runfleet.store.errors import InvalidInput, NotAnswerable
from runfleet.store.migrate import migrations
from runfleet.store.roles import GroupRole
from runfleet.store.values import text_digest
from tests.security import flows
from tests.security.conftest import Login, MakeLogin
from tests.security.test_roles import waiting_for_event
from tests.support.polling import until

pytestmark = pytest.mark.usefixtures("role_worker")

ANSWER = (
    "SELECT outcome, why FROM runfleet.answer(%s, %s, NULL, false, '\"forged\"'::json,"
    " 'raw', NULL, 1000, 'raw-sql', 1)"
)


async def _raw(who: Login, query: str, params: tuple[Any, ...]) -> Any:
    async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
        cur = await conn.execute(query.encode(), params)
        return await cur.fetchone()


async def test_a_granted_producer_completes_and_approves_through_the_queue(
    login: MakeLogin,
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", "hi", run_id="event-1")
        await waiting_for_event(q, run.id)
        assert isinstance(await q.complete(run.id, "go", {"ok": True}), EventCompleted)
        assert (await run.result(timeout=20))["answer"] == {"ok": True}
        done = [r for r in await q.store.journal.records(run.id) if r.kind == "deferred-completed"]
        assert [r.payload for r in done if r.payload.get("name") == "go"] == [
            {
                "name": "go",
                "woke": True,
                "answered_by": me.name,
                "note": None,
                "digest": text_digest('{"ok":true}'),  # which value won
            }
        ]

        asked = await q.enqueue("sec.approver", run_id="approval-1")

        async def parked() -> bool:
            row = await q.store.runs.get(asked.id)
            return bool(row and row.waiting and row.waiting.reason == "approval")

        await until(parked, 15, "the run to park on its approval")
        await q.approve(asked.id, flows.TOKENS[asked.id], actor="alice")
        assert await asked.result(timeout=20) == {"approved": True, "actor": me.name}
        decision = [
            r for r in await q.store.journal.records(asked.id) if r.kind.startswith("approval-")
        ]
        assert len(decision) == 1 and decision[0].kind == "approval-approved"
        assert decision[0].payload["actor"] == me.name and decision[0].payload["note"] == "alice"
        assert decision[0].payload["token"].startswith("sha256:")


async def test_raw_sql_cannot_write_an_answer_or_skip_the_checks(login: MakeLogin) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", "hi", run_id="raw-1")
        await waiting_for_event(q, run.id)
    for statement in (
        "INSERT INTO runfleet.deferreds (run_id, name, value, metadata, completed_at_ms)"
        " VALUES (%s, 'go', '\"forged\"', '{}', 0)",
        "UPDATE runfleet.deferreds SET value = '\"forged\"' WHERE run_id = %s",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await _raw(me, statement, (run.id,))
            pytest.fail(f"a producer ran: {statement}")
    # Calling the function itself meets the same checks as the Queue API: a timer's or a
    # child's deferred is never answerable, whoever asks and however.
    for name, why in (("sleep:1", "runfleet"), ("child:x", "runfleet"), ("approval:b", "approval")):
        assert await _raw(me, ANSWER, (run.id, name)) == ("not_answerable", why), name
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        with pytest.raises(NotAnswerable):
            await q.complete(run.id, "sleep:1", "forged")
        assert await q.store.deferreds.deferred(run.id, "sleep:1") is None
        assert await q.store.deferreds.deferred(run.id, "go") is None


async def test_an_ungranted_producer_gets_not_found_from_the_function(login: MakeLogin) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    intruder = await login(GroupRole.PRODUCER, "s2")
    operator = await login(GroupRole.OPERATOR, "s1")
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", "hi", run_id="victim-1")
        await waiting_for_event(q, run.id)
    # Through the function directly: exactly what an id never used gets.
    assert await _raw(intruder, ANSWER, (run.id, "go")) == ("not_found", None)
    assert await _raw(intruder, ANSWER, ("never-used", "go")) == ("not_found", None)
    # Through the Queue API, even declaring s1 (past the Python-level check).
    async with AsyncQueue("default", settings=intruder.settings, scopes=["s1", "s2"]) as q:
        with pytest.raises(InvalidInput) as caught:
            await q.store.deferreds.answer_event(run.id, "go", "forged")
        assert caught.value.field == "run_id"
    # An operator writes nothing, not even through the function.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await _raw(operator, ANSWER, (run.id, "go"))
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        assert await q.store.deferreds.deferred(run.id, "go") is None
        assert isinstance(await q.complete(run.id, "go", "real"), EventCompleted)
        assert (await q.run(run.id).result(timeout=20))["answer"] == "real"


def test_the_function_refuses_the_same_internal_namespaces_as_the_store() -> None:
    """runfleet.answer spells the internal prefixes as a regex; it must list the same set."""
    body = [m.sql for m in migrations() if "FUNCTION runfleet.answer(" in m.sql][-1]  # newest
    pattern = "^(" + "|".join(p.removesuffix(":") for p in INTERNAL_PREFIXES) + "):"
    assert f"v_target ~ '{pattern}'" in body
