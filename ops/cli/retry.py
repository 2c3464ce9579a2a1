"""``runfleet retry RUN`` and ``runfleet requeue --all-failed``: run failed runs again, as
rq's ``failed_job_registry.requeue`` (one, or every one of a queue: django-rq's bulk action).

A failed run stays failed (terminal is never left); the retry is the next round of
its lineage with the same flow and arguments (``producer.AsyncQueue.requeue``), and
every read of the old id answers with that round. A run parked ``dead`` (a poison run)
is not failed: retrying it is ``runfleet resume``, the same run moving on with its
recoveries in a row starting again.
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict

from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import LIST_MAX
from runfleet.ops.cli.produce import Scopes, actor
from runfleet.ops.cli.text import say
from runfleet.ops.models import RequeueResult
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, RunNotFound, ScopeDenied
from runfleet.store.registries import Registries, RegistryKind
from runfleet.store.types import RunStatus, WaitingReason


class RetryResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    """The failed run asked about."""
    retry_id: str
    """The round that runs it again (``lineage@n``)."""
    status: RunStatus
    resumed: bool = False
    """The run was parked dead and was resumed in place (``retry_id`` is its own id)."""


def register(app: typer.Typer) -> None:
    app.command("retry")(retry)
    app.command("requeue")(requeue)


def retry(
    run_id: Annotated[str, typer.Argument(help="The failed run's id.")],
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Run a failed run again (a new round; a second retry while it is open joins it)."""
    result = c.run(_retry(c.settings(), run_id, scope or []))
    if as_json:
        c.emit(result)
        return
    if result.resumed:
        say(
            f"run {result.run_id} was parked dead; resumed ({result.status.value}): its "
            "recoveries in a row start again"
        )
        return
    say(f"run {result.run_id} failed; retried as {result.retry_id} ({result.status.value})")


async def _retry(cfg: Settings, run_id: str, scopes: list[str]) -> RetryResult:
    await c.check_database(cfg.database_url)
    async with AsyncQueue("default", settings=cfg, scopes=scopes) as q:
        current = await q.authorized(run_id)
        if current.waiting is not None and current.waiting.reason == WaitingReason.DEAD:
            await q.resume(run_id, actor=actor())
            row = await q.authorized(run_id)
            return RetryResult(run_id=run_id, retry_id=row.id, status=row.status, resumed=True)
        again = await q.requeue(run_id, actor=actor())
        row = await again.fetch()
    return RetryResult(run_id=run_id, retry_id=row.id, status=row.status)


def requeue(
    queue: Annotated[str, typer.Option(help="The queue whose failed runs run again.")],
    all_failed: Annotated[
        bool,
        typer.Option(
            "--all-failed", help="Every failed run of the queue not requeued yet (required)."
        ),
    ] = False,
    flow: Annotated[str | None, typer.Option(help="Only failed runs of this flow.")] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=LIST_MAX, help="At most this many, oldest first.")
    ] = 1000,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be requeued; change nothing.")
    ] = False,
    scope: Scopes = None,
    as_json: c.AsJson = False,
) -> None:
    """Requeue a queue's failed runs: each as ``runfleet retry`` does (a new round, journaled)."""
    if not all_failed:
        raise typer.BadParameter("say which runs: --all-failed", param_hint="'--all-failed'")
    result = c.run(_requeue(c.settings(), queue, flow, limit, dry_run, scope or []))
    if as_json:
        c.emit(result)
        return
    for failed, again in result.requeued.items():
        say(f"{failed} would be requeued" if dry_run else f"{failed} requeued as {again}")
    for failed, why in result.refused.items():
        say(f"{failed} not requeued: {why}")
    what = "would be requeued" if dry_run else "requeued"
    say(f"{len(result.requeued)} failed run(s) of queue {queue} {what}")


async def _requeue(
    cfg: Settings, queue: str, flow: str | None, limit: int, dry_run: bool, scopes: list[str]
) -> RequeueResult:
    """The failed registry of ``queue`` (``store.registries``: no requeued or deleted run),
    each requeued through ``AsyncQueue.requeue``: the same round, checks and journal
    record as ``runfleet retry``, so a repeat (or a crash half-way) joins, never doubles."""
    await c.check_database(cfg.database_url)
    requeued: dict[str, str] = {}
    refused: dict[str, str] = {}
    async with AsyncQueue(queue, settings=cfg, scopes=scopes) as q:
        entries = await Registries(q.store).ids(RegistryKind.FAILED, queue, q.scopes, limit)
        for entry in entries:
            try:
                row = await q.authorized(entry.rq_id)
                if flow is not None and row.flow != flow:
                    continue
                if dry_run:
                    requeued[entry.rq_id] = entry.rq_id
                    continue
                again = await q.requeue(entry.rq_id, actor=actor())
            except (ScopeDenied, InvalidInput, RunNotFound) as exc:
                refused[entry.rq_id] = str(exc)
                continue
            requeued[entry.rq_id] = again.id
    return RequeueResult(
        queue=queue, flow=flow, dry_run=dry_run, requeued=requeued, refused=refused
    )
