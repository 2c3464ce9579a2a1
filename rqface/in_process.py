"""rq's ``Queue(is_async=False)``: an enqueued job's function run at once in the caller.

``is_async=False`` is what rq users' own unit tests rely on: ``enqueue`` runs the function
at once and answers with the finished (or failed) job. Here that job is NOT durable: it is
checked exactly as an enqueue is (arguments, options, ``job_id``) but nothing is written to
Postgres or Redis, no worker sees it, and ``Job.fetch`` of its id raises NoSuchJobError.
The answer is an ``InlineJob`` holding the outcome in memory; its reads (status, result,
``exc_info``, ``latest_result``, timestamps, meta) are the ``Job`` reads over that
outcome. Callbacks run in the caller as rq runs them, with the same arguments a worker
passes (the traceback as formatted text).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from runfleet.producer.run import outcome
from runfleet.rqface.connection import Connection
from runfleet.rqface.current import current_job
from runfleet.rqface.jobs import Job
from runfleet.rqface.perform import call, loaded_function
from runfleet.store.errors import InvalidInput
from runfleet.store.types import NewRun, RunError, RunRow, RunStatus


class InlineJob(Job):
    """The answer of an ``is_async=False`` enqueue: an outcome in memory, never stored."""

    def __init__(self, queue: Connection, row: RunRow, started_ms: int) -> None:
        super().__init__(queue, row.id)
        self._row = row
        self._started_ms = started_ms
        self._meta = row.meta

    def refresh(self) -> None:
        """Nothing to re-read: the outcome is this object."""

    def save_meta(self) -> None:
        """Kept on this object (an inline job has no row to write)."""

    def return_value(self, refresh: bool = False) -> Any:
        """The outcome held here (nothing stored to re-read)."""
        row = self._current
        return row.result if row.status is RunStatus.COMPLETED else None

    def wait(self, timeout: float = 30.0) -> Any:
        """Settled already: its result, or the error it failed with, at once."""
        return outcome(self._current)

    def cancel(
        self,
        *,
        actor: str | None = None,
        enqueue_dependents: bool = False,
        pipeline: Any = None,
        remove_from_dependencies: bool = False,
    ) -> Any:
        raise InvalidInput("job", "an is_async=False job has already run")

    def delete(
        self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False
    ) -> None:
        """Nothing stored, nothing to delete."""


def run_inline(queue: Connection, new: NewRun) -> InlineJob:
    """Run an admission's function now, in this thread; the outcome as an ``InlineJob``."""
    now = int(time.time() * 1000)
    state: dict[str, Any] = new.options.state()
    state["payload"] = new.payload
    row = _row(new, RunStatus.RUNNING, state, now, now)
    job = InlineJob(queue, row, now)
    payload = new.payload if isinstance(new.payload, dict) else {}
    args, kwargs = tuple(payload.get("args") or ()), dict(payload.get("kwargs") or {})
    callbacks = state.get("callbacks") or {}
    try:
        fn = loaded_function(new.flow)
        token = current_job.set(job)
        try:
            result = call(fn, args, kwargs)
        finally:
            current_job.reset(token)
    except Exception as exc:
        text = "".join(traceback.format_exception(exc))
        state["error"] = RunError(
            type=type(exc).__name__, module=type(exc).__module__, message=str(exc), traceback=text
        ).to_json()
        job._row = _row(new, RunStatus.FAILED, state, now, int(time.time() * 1000))
        if callbacks.get("on_failure"):
            loaded_function(callbacks["on_failure"])(job, None, type(exc), exc, text)
        return job
    state["result"] = result
    job._row = _row(new, RunStatus.COMPLETED, state, now, int(time.time() * 1000))
    if callbacks.get("on_success"):
        loaded_function(callbacks["on_success"])(job, None, result)
    return job


def _row(
    new: NewRun, status: RunStatus, state: dict[str, Any], created: int, updated: int
) -> RunRow:
    return RunRow(
        id=new.id,
        flow=new.flow,
        queue=new.queue,
        status=status,
        state=dict(state),
        owner=None,
        epoch=0,
        heartbeat_at_ms=None,
        claim=None,
        claimed_at_ms=None,
        cancel_requested_at_ms=None,
        lineage_id=new.id,
        round_ordinal=0,
        parent_run_id=None,
        created_at_ms=created,
        updated_at_ms=updated,
        waiting=None,
        now_ms=updated,
    )


__all__ = ["InlineJob", "run_inline"]
