"""Answering durable flows from a shell: ``complete``, ``approve``, ``deny``, ``resume``
(``ops.cli.history`` for a failed or cancelled run).

Each goes through ``producer.AsyncQueue`` as a producer's code would, so scope
checks, the journal record (who answered, when, why) and the wake hint are the
same whichever way an answer arrives.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, assert_never

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli import history
from runfleet.ops.cli.produce import Scopes, actor
from runfleet.ops.cli.text import say
from runfleet.ops.models import AnswerResult
from runfleet.producer import (
    AsyncQueue,
    EventCompleted,
    EventExisting,
    EventRunSettled,
    EventTimedOut,
)

Token = Annotated[
    str, typer.Option("--token", help="The token the flow sent its approver (on_token).")
]
Actor = Annotated[
    str | None,
    typer.Option(
        "--actor", help="Who you say you are, kept as a note (the database role is the actor)."
    ),
]
Reason = Annotated[str | None, typer.Option("--reason", help="Why, for the journal.")]
Value = Annotated[str | None, typer.Option("--value", help="A JSON value to hand the flow.")]


def register(app: typer.Typer) -> None:
    app.command("complete")(complete)
    app.command("approve")(approve)
    app.command("deny")(deny)
    app.command("resume")(resume)


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        c.fail(f"--value is not valid JSON: {exc}")
    except RecursionError:
        c.fail("--value is nested too deeply")


def _act(
    run_id: str,
    scopes: list[str] | None,
    action: str,
    call: Callable[[AsyncQueue], Awaitable[str | None]],
    as_json: bool,
) -> None:
    async def go() -> AnswerResult:
        cfg = c.settings()
        await c.check_database(cfg.database_url)
        async with AsyncQueue("default", settings=cfg, scopes=scopes or []) as q:
            done = await call(q) or action
            row = await q.authorized(run_id)
        return AnswerResult(run_id=run_id, action=done, status=row.status)  # type: ignore[arg-type]  # done is one of AnswerResult's action words, typed str by the call

    result = c.run(go())
    if as_json:
        c.emit(result)
        return
    say(f"run {run_id}: {result.action}; it is {result.status.value}")


def complete(
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    event: Annotated[str, typer.Argument(help="The event name the flow waits for.")],
    value: Value = None,
    who: Actor = None,
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Complete an event a flow waits for (``ctx.wait_for``); the first answer wins.

    Only events: an approval, a child, a timer or a quota is refused. The journal names
    the database role that answered; ``--actor`` is kept beside it as a note. The action
    says what stands: ``completed`` (this value), ``already-completed`` (an earlier
    answer with this very value, e.g. a retry whose reply was lost), ``answered-otherwise``
    (another value won), ``timed-out`` (the wait's timeout came first), ``run-settled``.
    """
    payload = _json(value)

    async def call(q: AsyncQueue) -> str:
        match await q.complete(run_id, event, payload, actor=who or actor()):
            case EventCompleted():
                return "completed"
            case EventExisting(same=same):
                return "already-completed" if same else "answered-otherwise"
            case EventTimedOut():
                return "timed-out"
            case EventRunSettled():
                return "run-settled"
            case unreachable:
                assert_never(unreachable)

    _act(run_id, scope, "completed", call, as_json)


def _decide(approved: bool) -> Callable[..., None]:
    def command(
        run_id: Annotated[str, typer.Argument(help="The run's id.")],
        token: Token,
        value: Value = None,
        who: Actor = None,
        reason: Reason = None,
        scope: Scopes = None,
        as_json: c.AsJson = False,
    ) -> None:
        payload = _json(value)

        async def call(q: AsyncQueue) -> None:
            answer = q.approve if approved else q.deny
            await answer(run_id, token, payload, actor=who or actor(), reason=reason)

        _act(run_id, scope, "approved" if approved else "denied", call, as_json)

    command.__doc__ = ("Approve" if approved else "Deny") + " the approval a run is parked on."
    return command


approve = _decide(True)
deny = _decide(False)


def resume(
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    accept_recorded: Annotated[
        bool, typer.Option("--accept-recorded", help="Trust the recorded outputs as they are.")
    ] = False,
    rerun_step: Annotated[
        str | None, typer.Option("--rerun-step", help="Forget this step's record and run it again.")
    ] = None,
    who: Actor = None,
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Resume a failed or cancelled run from its recorded calls, or move a quarantined or
    dead run on (journaled with who decided).

    A failed or cancelled run takes no option: the next round of its lineage replays its
    recorded calls and runs on from there (DBOS resume_workflow). A quarantined run needs
    exactly one of --accept-recorded or --rerun-step KEY; a run parked dead (its
    executions kept ending in a lost process) takes neither: its recoveries in a row
    start again and its body re-runs from its last recorded step.
    """
    if accept_recorded and rerun_step is not None:
        c.fail("choose at most one of --accept-recorded or --rerun-step KEY")
    history.resume(
        run_id,
        accept_recorded=accept_recorded,
        rerun_step=rerun_step,
        note=who or actor(),
        scopes=scope or [],
        as_json=as_json,
    )
