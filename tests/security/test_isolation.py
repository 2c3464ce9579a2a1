"""A role without grant S cannot read, join, cancel, answer or even detect a run of scope S.

The intruder is a real producer login role granted only ``s2``; it declares ``s1`` in its
Queue (so the Python-level scope check, the second line, lets it through) and still sees
nothing: Postgres decides. Every refusal must look exactly like the refusal for an id
that was never used.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql

from runfleet.producer import AsyncQueue, RunNotFound
from runfleet.store.errors import RunfleetError
from runfleet.store.roles import GroupRole
from runfleet.store.types import EventCompleted, RunStatus
from tests.ops.conftest import CliResult, cli_env, invoke
from tests.security.conftest import Login, MakeLogin
from tests.security.test_roles import waiting_for_event

pytestmark = pytest.mark.usefixtures("role_worker")

SECRET = "tenant-one-secret-payload"
GHOST = "never-used-id"


async def _owner_run(owner: Login) -> str:
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.full", SECRET, run_id="victim")
        await waiting_for_event(q, run.id)
        return run.id


async def _refusal(call: Any) -> str:
    """What a refused call tells its caller: the exception's type and text."""
    try:
        await call
    except (RunfleetError, psycopg.Error) as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("the call was not refused")


async def test_an_ungranted_producer_cannot_touch_or_detect_the_run(login: MakeLogin) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    intruder = await login(GroupRole.PRODUCER, "s2")
    victim = await _owner_run(owner)

    async with AsyncQueue("default", settings=intruder.settings, scopes=["s1", "s2"]) as q:
        for rid in (victim, GHOST):
            with pytest.raises(RunNotFound):
                await q.run(rid).get_status()
        # Each refusal reads exactly as for an id nobody ever used.
        for make in (
            lambda rid: q.cancel(rid),
            lambda rid: q.complete(rid, "go", "forged"),
            lambda rid: q.run(rid).result(timeout=1),
        ):
            assert (await _refusal(make(victim))).replace(victim, GHOST) == await _refusal(
                make(GHOST)
            )
        # Declaring s1 gets it past the Python check, not past Postgres.
        joined = await _refusal(q.enqueue("sec.leaf", 1, run_id=victim))
        assert "row-level security" in joined  # it may not admit runs of s1 at all
    async with AsyncQueue("default", settings=intruder.settings, scopes=["s2"]) as q:
        # Re-using the id under its own scope: refused, since the id space is shared (the
        # one bit "taken" is all it learns), without the run's flow, payload or scopes.
        joined = await _refusal(q.enqueue("sec.leaf", 1, run_id=victim))
        assert joined == (
            f"InvalidInput: invalid run_id: run id {victim!r} or round 0 of lineage {victim!r}"
            " already belongs to another run"
        )
        for leaked in (SECRET, "sec.full", "s1", "suspended", "pending"):
            assert leaked not in joined, joined
    # Raw SQL with the same credentials: nothing visible (where the owner sees rows in
    # every table), nothing changeable.
    for who, visible in ((owner, True), (intruder, False)):
        async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
            for table in ("runs", "journal", "steps", "attempts", "deferreds", "clocks"):
                column = "id" if table == "runs" else "run_id"
                query = sql.SQL("SELECT count(*) FROM runfleet.{} WHERE {} = %s").format(
                    sql.Identifier(table), sql.Identifier(column)
                )
                cur = await conn.execute(query, (victim,))
                row = await cur.fetchone()
                assert row is not None and (row[0] > 0) is visible, (who.name, table)
    async with await psycopg.AsyncConnection.connect(intruder.url, autocommit=True) as conn:
        cur = await conn.execute(
            "UPDATE runfleet.runs SET cancel_requested_at_ms = 1 WHERE id = %s", (victim,)
        )
        assert cur.rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "INSERT INTO runfleet.deferreds (run_id, name, value, completed_at_ms)"
                " VALUES (%s, 'go', '1', 0)",
                (victim,),
            )

    # The run went on untouched: no cancel, no answer, no intruder record.
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        run = await q.run(victim).fetch()
        assert run.status is RunStatus.SUSPENDED and run.cancel_requested_at_ms is None
        assert run.payload == {"args": [SECRET], "kwargs": {}}
        assert isinstance(await q.complete(victim, "go", "real"), EventCompleted)
        assert (await q.run(victim).result(timeout=20))["answer"] == "real"


def _same_as_ghost(victim: str, seen: CliResult, ghost: CliResult) -> None:
    assert seen.clean and ghost.clean, (seen.exception, ghost.exception)
    assert seen.code == ghost.code
    assert seen.stdout.replace(victim, GHOST) == ghost.stdout
    assert seen.stderr.replace(victim, GHOST) == ghost.stderr


async def test_cli_commands_run_under_the_callers_policies(login: MakeLogin) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    intruder = await login(GroupRole.PRODUCER, "s2")
    operator = await login(GroupRole.OPERATOR, "s1")
    victim = await _owner_run(owner)

    env = cli_env(intruder.settings)
    listed = await invoke(env, "runs", "--json")
    assert listed.code == 0 and victim not in listed.stdout and SECRET not in listed.stdout
    for command in ("show", "explain", "journal", "tree"):
        seen, ghost = await invoke(env, command, victim), await invoke(env, command, GHOST)
        _same_as_ghost(victim, seen, ghost)
        assert SECRET not in seen.stdout + seen.stderr
    for command, *rest in (
        ("cancel",),
        ("complete", "go"),
        ("resume", "--accept-recorded"),
        ("resume",),
        ("fork", "--from-step", "0"),
        ("delete",),
    ):
        seen = await invoke(env, command, victim, *rest, "--scope", "s1")
        ghost = await invoke(env, command, GHOST, *rest, "--scope", "s1")
        _same_as_ghost(victim, seen, ghost)
        assert seen.code != 0, (command, seen)

    # The operator granted s1 reads everything about it, and changes nothing.
    env = cli_env(operator.settings)
    listed = await invoke(env, "runs", "--json")
    assert listed.code == 0 and victim in listed.stdout
    # What each command prints of the run: its id, except the journal, whose lines name
    # the id only when a record happens to (a child's token, say), so its first record.
    for command, mark in (
        ("show", victim),
        ("explain", victim),
        ("journal", "created as sec.full"),
        ("tree", victim),
    ):
        shown = await invoke(env, command, victim)
        assert shown.code == 0 and mark in shown.stdout, (command, shown)
    refused = await invoke(env, "cancel", victim, "--scope", "s1")
    assert refused.clean and refused.code != 0, refused
    assert "may not do this: permission denied for table runs" in refused.stderr
    # Fork writes recorded steps and delete removes a run's rows: the operator may read the
    # run and still do neither, the run's own producer may not fork it (it may delete it
    # once settled: tests/security/test_odd_rows.py); Postgres refuses them.
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        settled = await q.enqueue("sec.full", "x", run_id="settled")
        await waiting_for_event(q, settled.id)
        await q.complete(settled.id, "go", "done")
        await settled.result(timeout=20)
    for who, run_id, command, *rest in (
        (operator, victim, "fork", "--from-step", "0"),
        (operator, settled.id, "delete"),
        (owner, victim, "fork", "--from-step", "0"),
    ):
        refused = await invoke(cli_env(who.settings), command, run_id, *rest, "--scope", "s1")
        assert refused.clean and refused.code == 1, (who.name, command, refused)
        assert "may not do this: permission denied for" in refused.stderr, refused
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        assert (await q.run(victim).fetch()).cancel_requested_at_ms is None
        assert (await q.run(settled.id).fetch()).status is RunStatus.COMPLETED
    # The fleet's role may: the fork is journaled with that role as the actor.
    fleet = await login(GroupRole.WORKER)
    forked = await invoke(
        cli_env(fleet.settings),
        "fork",
        victim,
        "--from-step",
        "0",
        "--id",
        "v-fork",
        "--scope",
        "s1",
    )
    assert forked.clean and forked.code == 0, forked
    async with await psycopg.AsyncConnection.connect(fleet.url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT payload->>'actor' FROM runfleet.journal WHERE run_id = %s AND kind = 'forked'",
            (victim,),
        )
        assert await cur.fetchall() == [(fleet.name,)]
    deleted = await invoke(cli_env(fleet.settings), "delete", settled.id, "--scope", "s1")
    assert deleted.clean and deleted.code == 0, deleted
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        with pytest.raises(RunNotFound):
            await q.run(settled.id).fetch()


WRITES: dict[str, LiteralString] = {
    "runs": "UPDATE runfleet.runs SET updated_at_ms = updated_at_ms",
    "journal": "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, digest,"
    " at_ms) SELECT id, 'x', 'op', 1, 'd', 0 FROM runfleet.runs",
    "steps": "DELETE FROM runfleet.steps",
    "deferreds": "INSERT INTO runfleet.deferreds (run_id, name, completed_at_ms)"
    " SELECT id, 'go', 0 FROM runfleet.runs",
    "clocks": "UPDATE runfleet.clocks SET due_at_ms = 0",
    "grants": "INSERT INTO runfleet.grants (role, scope, granted_at_ms)"
    " VALUES (current_user::regrole, '*', 0)",
    "flows": "DELETE FROM runfleet.flows",
}


async def test_the_operator_reads_its_scopes_only_and_writes_nothing(login: MakeLogin) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    operator = await login(GroupRole.OPERATOR, "s1")
    blind = await login(GroupRole.OPERATOR, "s2")
    victim = await _owner_run(owner)
    for who, expected in ((operator, 1), (blind, 0)):
        async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
            cur = await conn.execute("SELECT count(*) FROM runfleet.runs WHERE id = %s", (victim,))
            assert (await cur.fetchone()) == (expected,)
            for table, statement in WRITES.items():
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await conn.execute(statement)
                    pytest.fail(f"{who.name} wrote {table}")
