"""The dashboard's buttons: cancel, approve, deny, resume, retry — the CLI's calls on the
same queue, each shown only on a run whose state it fits (``fitting``).

Each goes through ``producer.AsyncQueue`` with the scopes the dashboard was started with
(``runfleet dashboard --scope``), so a run whose scopes they do not cover is refused
exactly as ``runfleet cancel`` refuses it, and each decision is journaled with the
actor ``dashboard:<login>@<host>``. The database role (RUNFLEET_DATABASE_URL) and its
row-level security apply underneath, as for every producer.
"""

from __future__ import annotations

import getpass
import json
import socket
from enum import StrEnum
from typing import Any, Literal, assert_never

from runfleet.ops.cli import common as c
from runfleet.ops.cli.produce import cancel_on
from runfleet.ops.models import AnswerResult, CancelResult, RunSummary
from runfleet.producer import AsyncQueue
from runfleet.store.types import RunStatus, WaitingReason


class Action(StrEnum):
    CANCEL = "cancel"
    APPROVE = "approve"
    DENY = "deny"
    RESUME = "resume"
    RETRY = "retry"


def fitting(run: RunSummary) -> frozenset[Action]:
    """The buttons a run in this state can take: cancel an open run not yet asked to stop,
    answer an approval it waits for, resume it from quarantine or dead, retry it failed
    (once: a requeued run is retried through the round that replaced it)."""
    reason = run.waiting.reason if run.waiting is not None else None
    match run.status:
        case RunStatus.PENDING | RunStatus.RUNNING | RunStatus.SUSPENDED:
            fits = set() if run.cancel_requested_at_ms is not None else {Action.CANCEL}
            if reason == WaitingReason.APPROVAL:
                fits |= {Action.APPROVE, Action.DENY}
            if reason in (WaitingReason.QUARANTINE, WaitingReason.DEAD):
                fits.add(Action.RESUME)
            return frozenset(fits)
        case RunStatus.FAILED:
            return frozenset() if run.requeued_as else frozenset({Action.RETRY})
        case RunStatus.COMPLETED | RunStatus.CANCELLED:
            return frozenset()
        case _ as never:
            assert_never(never)


def actor() -> str:
    """Who decided, for the journal: the login the dashboard runs as, and its host."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (containers): the host still says where it came from
        user = "unknown"
    return f"dashboard:{user}@{socket.gethostname()}"


def _value(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise c.UserError(f"value is not valid JSON: {exc}") from None


async def perform(
    q: AsyncQueue, action: Action, run_id: str, form: dict[str, str]
) -> CancelResult | AnswerResult:
    """Carry out one button press; caller errors raise (ScopeDenied, InvalidInput, …)."""
    who = actor()
    reason = form.get("reason", "").strip() or None
    done: Literal["approved", "denied", "resumed", "retried"]
    match action:
        case Action.CANCEL:
            return await cancel_on(q, run_id, who)
        case Action.APPROVE | Action.DENY:
            token = form.get("token", "").strip()
            if not token:
                raise c.UserError("an approval needs its token")
            answer = q.approve if action is Action.APPROVE else q.deny
            await answer(run_id, token, _value(form.get("value", "")), actor=who, reason=reason)
            done = "approved" if action is Action.APPROVE else "denied"
        case Action.RESUME:
            rerun = form.get("rerun_step", "").strip() or None
            current = await q.authorized(run_id)
            if rerun is None and current.waiting and current.waiting.reason == WaitingReason.DEAD:
                await q.resume(run_id, actor=who)  # a poison run: its count starts again
            else:
                await q.resume(run_id, accept_recorded=rerun is None, rerun_step=rerun, actor=who)
            done = "resumed"
        case Action.RETRY:  # runfleet retry: a new round of the failed run's lineage
            again = await (await q.requeue(run_id, actor=who)).fetch()
            return AnswerResult(run_id=again.id, action="retried", status=again.status)
    row = await q.authorized(run_id)
    return AnswerResult(run_id=run_id, action=done, status=row.status)
