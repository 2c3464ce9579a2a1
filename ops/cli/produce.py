"""Acting on runs from a shell: ``enqueue`` and ``cancel``, through the producer API.

They go through ``producer.AsyncQueue`` exactly as a producer's code would, so the CLI
admits and cancels with the same transaction, journal record and stream hint.
The durable-flow answers (``resume``, ``approve``, ``deny``, ``complete``) will sit
beside these.
"""

from __future__ import annotations

import getpass
import json
import socket
from typing import Annotated, Any, assert_never

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.text import say
from runfleet.ops.models import CancelResult, EnqueueResult
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store.config import Settings
from runfleet.store.errors import RunNotFound
from runfleet.store.types import (
    AlreadyRequested,
    AlreadyTerminal,
    CancelRequested,
    NotFound,
    RunStatus,
)

Scopes = Annotated[
    list[str] | None,
    typer.Option(
        "--scope", help="A scope this caller holds (repeatable); runs need covering ones."
    ),
]


def register(app: typer.Typer) -> None:
    app.command("enqueue")(enqueue)
    app.command("cancel")(cancel)


def actor() -> str:
    """Who asked, for the journal: the operator's login on this host."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (containers): the host still says where it came from
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def parse_payload(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    """``{"args": [...], "kwargs": {...}}``, or a list (args), or an object (kwargs).

    An object whose only keys are ``args`` and/or ``kwargs`` is the explicit form;
    any other object is keyword arguments.
    """
    if text is None or not text.strip():
        return [], {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise c.UserError(f"--payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise c.UserError("--payload is nested too deeply") from None
    if isinstance(value, list):
        return value, {}
    if not isinstance(value, dict):
        raise c.UserError("--payload must be a JSON list (args) or object (kwargs)")
    if value and set(value) <= {"args", "kwargs"}:
        args, kwargs = value.get("args", []), value.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise c.UserError('--payload "args" must be a list and "kwargs" an object')
        return args, kwargs
    return [], value


def enqueue(
    flow: Annotated[str, typer.Argument(help="Flow name, or 'module:function'.")],
    payload: Annotated[
        str | None,
        typer.Option(help='JSON: {"args": [...], "kwargs": {...}}, a list, or an object.'),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--id", help="Run id (idempotency key); default: random.")
    ] = None,
    queue: Annotated[str, typer.Option(help="Queue to admit the run on.")] = "default",
    scope: Scopes = None,
    late_binding: Annotated[
        bool,
        typer.Option(
            "--late-binding",
            help="Admit a flow no worker has registered yet (it runs once one does).",
        ),
    ] = False,
    as_json: c.AsJson = False,
) -> None:
    """Admit one run (re-using an id joins the identical run already there)."""
    try:
        args, kwargs = parse_payload(payload)
    except c.UserError as exc:
        c.fail(str(exc))
    spec = EnqueueSpec(flow, tuple(args), kwargs, run_id)
    result = c.run(_enqueue(c.settings(), spec, queue, scope or [], late_binding))
    if as_json:
        c.emit(result)
        return
    say(f"run {result.run_id} ({result.flow} on queue {result.queue}) is {result.status.value}")


async def _enqueue(
    cfg: Settings, spec: EnqueueSpec, queue: str, scopes: list[str], late_binding: bool
) -> EnqueueResult:
    await c.check_database(cfg.database_url)
    async with AsyncQueue(queue, settings=cfg, scopes=scopes, late_binding=late_binding) as q:
        (handle,) = await q.enqueue_many([spec])
        row = await handle.fetch()
    return EnqueueResult(run_id=row.id, flow=row.flow, queue=row.queue, status=row.status)


def cancel(
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Request cancellation (durable first; the owner is told at once by publish)."""
    result = c.run(_cancel(c.settings(), run_id, scope or []))
    if as_json:
        c.emit(result)
        return
    words = {
        "requested": f"cancellation requested (the run was {result.status.value}); "
        "its owner or a sweep closes it as cancelled",
        "already-requested": f"cancellation was already requested; the run is "
        f"{result.status.value}",
        "already-terminal": f"nothing to cancel: the run already {result.status.value}"
        if result.status is not RunStatus.CANCELLED
        else "nothing to cancel: the run is already cancelled",
    }
    say(f"run {result.run_id}: {words[result.outcome]}.")


async def _cancel(cfg: Settings, run_id: str, scopes: list[str]) -> CancelResult:
    await c.check_database(cfg.database_url)
    async with AsyncQueue("default", settings=cfg, scopes=scopes) as q:
        return await cancel_on(q, run_id, actor())


async def cancel_on(q: AsyncQueue, run_id: str, who: str) -> CancelResult:
    """``cancel --json`` through an open queue (the dashboard's cancel button too)."""
    outcome = await q.cancel(run_id, actor=who)
    match outcome:
        case CancelRequested(row=row):
            return CancelResult(run_id=run_id, outcome="requested", status=row.status)
        case AlreadyRequested(row=row):
            return CancelResult(run_id=run_id, outcome="already-requested", status=row.status)
        case AlreadyTerminal(row=row):
            return CancelResult(run_id=run_id, outcome="already-terminal", status=row.status)
        case NotFound():
            raise RunNotFound(run_id)
    assert_never(outcome)
