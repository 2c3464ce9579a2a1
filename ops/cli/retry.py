"""``runfleet retry RUN``: run a failed run again, as rq's ``failed_job_registry.requeue``.

A failed run stays failed (terminal is never left); the retry is the next round of
its lineage with the same flow and arguments (``broker.AsyncQueue.requeue``), and
every read of the old id answers with that round. A run parked ``dead`` (a poison run)
is not failed: retrying it is ``runfleet resume``, the same run moving on with its
recoveries in a row starting again.
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict

from runfleet.broker import AsyncQueue
from runfleet.ops.cli import common as c
from runfleet.ops.cli.produce import Scopes, actor
from runfleet.ops.cli.text import say
from runfleet.store.config import Settings
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
