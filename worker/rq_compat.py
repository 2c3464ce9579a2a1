"""rq's per-job options for plain functions: ``retry=Retry(max, interval)``, the
``on_success`` / ``on_failure`` / ``on_stopped`` callbacks and ``depends_on``, as a
producer gave them at enqueue (producer/admission.py).

The worker's part: the step that calls the function under rq's retry policy, callbacks
resolved by this worker's allow-list, what a stop runs. What rq's semantics read of the
running job (``get_current_job()``, the ``depends_on`` wait, a returned ``Retry``) is
rqface/running.py, and the job timeout rqface/job_timeouts.py: the worker hands the
running flow and its context down to them.

A plain function enqueued with any of them runs as one recorded step (``call``)
whose retry policy is rq's: ``max`` further tries, waiting ``interval[i]`` seconds
before try ``i+2`` (the last interval repeats). The callbacks run in the worker
after the function, as rq runs them, but as recorded steps of the same run, so a
takeover neither repeats one that finished nor skips one that did not: a raising
``on_success`` fails the run (rq moves the job to the failed registry likewise).
Callbacks are named ``module:function`` and imported as a plain-function flow is
(the same trust: a producer that may enqueue may name any importable function).
"""

from __future__ import annotations

import builtins
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from runfleet.rqface.job_timeouts import job_timeout, timed
from runfleet.rqface.jobs import JobStatus
from runfleet.rqface.running import (
    asking_retry,
    await_dependencies,
    job_of,
    retrying_returned,
    running_job,
)
from runfleet.worker.authoring.context import Context
from runfleet.worker.authoring.durable import Cause, Retry
from runfleet.worker.authoring.flows import Flow
from runfleet.worker.resolver import resolve
from runfleet.worker.threads import in_thread


@dataclass(frozen=True)
class IntervalRetry(Retry):
    """rq's fixed intervals instead of exponential backoff."""

    intervals: tuple[float, ...] = (0.0,)

    def delay(self, attempt: int) -> float:
        return float(self.intervals[min(attempt - 1, len(self.intervals) - 1)])


def rq_retry(state: dict[str, Any]) -> Retry | None:
    spec = state.get("retry")
    if not isinstance(spec, dict):
        return None
    intervals = tuple(float(i) for i in spec.get("intervals") or [0]) or (0.0,)
    # Any interval parks the run on a timer, as rq schedules the retry: it reads
    # ``scheduled`` and sits in the scheduled registry until then, and frees its slot.
    attempts = int(spec.get("max", 0)) + 1
    return IntervalRetry(attempts=attempts, intervals=intervals, jitter=0.0, park_over=0.0)


log = logging.getLogger("runfleet.worker.rq")


def _quiet(fn: Any) -> Any:
    """The callback, returning None: its return value is not a run output to store."""

    def call(*args: Any) -> None:
        fn(*args)

    return call


async def call_rq_style(flow: Flow, ctx: Context) -> Any:
    state = ctx.run.state
    callbacks = state.get("callbacks") or {}
    assert isinstance(callbacks, dict)
    if ctx.run.depends_on:
        await await_dependencies(ctx, list(ctx.run.depends_on), bool(state.get("allow_failure")))
    try:
        with running_job(flow, ctx):
            call = asking_retry(timed(flow.fn, job_timeout(state)))
            retry, args, kwargs = rq_retry(state), ctx.args, ctx.kwargs
            result = await retrying_returned(
                ctx, lambda: ctx.step("call", call, *args, retry=retry, **kwargs)
            )
    except BaseException as exc:
        if not isinstance(exc, Exception) and not ctx.raised_by_user(exc):
            if ctx.interrupted is Cause.CANCELLED and callbacks.get("on_stopped"):
                await _stopped(flow, ctx, str(callbacks["on_stopped"]))
            raise  # runfleet's own stop (cancel, shutdown, a park): not a failure
        name = callbacks.get("on_failure")
        if name:
            tb = "".join(traceback.format_exception(exc))
            on_failure = _quiet(resolve_callback(str(name)))
            job = job_of(flow, ctx, JobStatus.FAILED)
            await ctx.step("rq.on_failure", on_failure, job, None, type(exc), exc, tb)
        raise
    name = callbacks.get("on_success")
    if name:
        job = job_of(flow, ctx, JobStatus.FINISHED)
        await ctx.step("rq.on_success", _quiet(resolve_callback(str(name))), job, None, result)
    return result


async def _stopped(flow: Flow, ctx: Context, name: str) -> None:
    """rq's ``on_stopped(job, connection)``: the job was cancelled while it ran. Called
    once by the worker that stops it, not recorded (the run settles cancelled right
    after; a worker lost in between does not call it). Its errors are logged, as rq's."""
    try:
        await in_thread(resolve_callback(name), job_of(flow, ctx, JobStatus.CANCELED), None)
    except Exception as exc:
        log.warning("rq.on_stopped_failed", extra={"run_id": ctx.run.id, "error": repr(exc)})


def resolve_callback(name: str) -> Any:
    """A callback's function: an allowed ``module:function``, or a builtin (rq takes
    ``print``)."""
    if name.startswith("builtins:"):
        return getattr(builtins, name.partition(":")[2])
    return resolve(name).fn
