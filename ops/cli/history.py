"""A run's history from a shell: ``fork RUN --from-step N``, ``resume RUN`` (a failed or
cancelled run), ``delete RUN`` (docs/explanation/lifecycle.md "Resume, fork, delete").

Each goes through ``producer.AsyncQueue`` as a producer's code would, under the caller's
database role and its row-security policies: a run the role cannot see is refused
exactly like an id never used, and a role that may not write recorded steps or delete a
run's rows (a producer, the operator) is refused by Postgres. Fork and resume journal the
authenticated role as the actor on both runs (``--actor`` is kept beside it as a note);
a delete leaves no journal (it is the journal's end): the producer logs ``run.deleted``
with the actor.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.produce import Scopes, actor
from runfleet.ops.cli.text import say
from runfleet.ops.models import AnswerResult, HistoryResult
from runfleet.producer import AsyncQueue
from runfleet.store.errors import InvalidInput
from runfleet.store.types import RunStatus

RunId = Annotated[str, typer.Argument(help="The run's id.")]
Actor = Annotated[
    str | None,
    typer.Option(
        "--actor", help="Who you say you are, kept as a note (the database role is the actor)."
    ),
]

SETTLED_RESUMABLE = (RunStatus.FAILED, RunStatus.CANCELLED)


def register(app: typer.Typer) -> None:
    app.command("fork")(fork)
    app.command("delete")(delete)


def _show(result: HistoryResult, as_json: bool) -> None:
    if as_json:
        c.emit(result)
        return
    match result.action:
        case "forked" | "resumed-as":
            verb = "forked into" if result.action == "forked" else "resumed as"
            say(
                f"run {result.run_id} {verb} {result.new_run_id}, which replays its first "
                f"{result.calls} recorded call(s); it is "
                f"{result.status.value if result.status else '?'}"
            )
        case "deleted":
            say(
                f"run {result.run_id} deleted: {len(result.deleted_run_ids)} round(s), "
                f"{result.journal} journal record(s), {result.steps} recorded call(s)"
            )


def fork(
    run_id: RunId,
    from_step: Annotated[
        int,
        typer.Option(
            "--from-step",
            help="How many recorded calls the new run replays (positions 0..N-1).",
        ),
    ],
    new_id: Annotated[
        str | None, typer.Option("--id", help="The new run's id (default: RUN~fork-<hex>).")
    ] = None,
    who: Actor = None,
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Fork a run from call N: a new run replays its first N recorded calls and executes
    from there (DBOS fork_workflow, Temporal reset); any status. Journaled on both runs."""

    async def go() -> HistoryResult:
        cfg = c.settings()
        await c.check_database(cfg.database_url)
        async with AsyncQueue("default", settings=cfg, scopes=scope or []) as q:
            new = await q.fork(run_id, from_step, new_run_id=new_id, actor=who or actor())
            row = await q.authorized(new.id)
        return HistoryResult(
            run_id=run_id,
            action="forked",
            new_run_id=row.id,
            calls=int(row.state.get("replays", from_step)),
            status=row.status,
        )

    _show(c.run(go()), as_json)


def delete(
    run_id: RunId,
    who: Actor = None,
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Delete a settled run — every round of its lineage — with its journal, steps,
    attempts, waits, clocks, events, messages and DAG edges (children stay). An open
    round refuses it."""

    async def go() -> HistoryResult:
        cfg = c.settings()
        await c.check_database(cfg.database_url)
        async with AsyncQueue("default", settings=cfg, scopes=scope or []) as q:
            done = await q.delete_run(run_id, actor=who or actor())
        if not done.run_ids:  # the API answers nothing (DBOS's); a command says so
            c.fail(f"no run {run_id} to delete (none by that id this role can see)")
        return HistoryResult(
            run_id=run_id,
            action="deleted",
            deleted_run_ids=list(done.run_ids),
            journal=done.journal,
            steps=done.steps,
        )

    _show(c.run(go()), as_json)


def resume(
    run_id: str,
    *,
    accept_recorded: bool,
    rerun_step: str | None,
    note: str | None,
    scopes: list[str],
    as_json: bool,
) -> None:
    """``runfleet resume RUN``: a failed or cancelled run resumes from its recorded calls
    (the next round of its lineage); a quarantined or dead run moves on in place."""

    async def go() -> HistoryResult | AnswerResult:
        cfg = c.settings()
        await c.check_database(cfg.database_url)
        async with AsyncQueue("default", settings=cfg, scopes=scopes) as q:
            row = await q.authorized(run_id)
            if row.status in SETTLED_RESUMABLE:
                if accept_recorded or rerun_step is not None:
                    raise InvalidInput(
                        "resume",
                        f"run {run_id!r} is {row.status.value}: it resumes from its recorded "
                        "calls; --accept-recorded and --rerun-step are for a quarantined run",
                    )
                resumed = await q.resume_run(run_id, actor=note)
                fresh = await resumed.current()
                return HistoryResult(
                    run_id=run_id,
                    action="resumed-as",
                    new_run_id=fresh.id,
                    calls=int(fresh.state.get("replays", 0)),
                    status=fresh.status,
                )
            await q.resume(
                run_id, accept_recorded=accept_recorded, rerun_step=rerun_step, actor=note
            )
            after = await q.authorized(run_id)
        return AnswerResult(run_id=run_id, action="resumed", status=after.status)

    result = c.run(go())
    if isinstance(result, HistoryResult):
        _show(result, as_json)
    elif as_json:
        c.emit(result)
    else:
        say(f"run {run_id}: {result.action}; it is {result.status.value}")
