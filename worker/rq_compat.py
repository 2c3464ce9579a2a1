"""rq's per-job options for plain functions: ``retry=Retry(max, interval)``, the
``on_success`` / ``on_failure`` callbacks and ``depends_on``, as a producer gave them
at enqueue (broker/admission.py).

A run with ``depends_on`` first waits, durably, until every dependency completed
(``await_dependencies``); a failed or cancelled dependency leaves it waiting, as rq
leaves a job deferred.

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

import traceback
from dataclasses import dataclass, field
from typing import Any

from runfleet.store.jobs import Jobs
from runfleet.worker.context import Context
from runfleet.worker.durable import Retry
from runfleet.worker.flows import Flow, resolve


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
    return IntervalRetry(attempts=int(spec.get("max", 0)) + 1, intervals=intervals, jitter=0.0)


@dataclass(frozen=True)
class CallbackJob:
    """What an rq callback reads from its ``job`` argument, as of the end of the call."""

    id: str
    func_name: str
    origin: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    description: str | None = None


def wants_rq_call(flow: Flow, ctx: Context) -> bool:
    state = ctx.run.state
    options = ("retry", "callbacks", "depends_on")
    return not flow.takes_context and any(state.get(k) for k in options)


DEPENDENCY_POLL_MAX = 5.0
"""Longest wait between two looks at open dependencies (seconds)."""
DEPENDENCY_POLL_BROKEN = 60.0
"""Between two looks while a dependency failed or was cancelled (rq leaves the job
deferred; a requeued dependency that then completes releases it)."""


async def await_dependencies(ctx: Context, run_ids: list[str]) -> None:
    """rq's ``depends_on``: return once every dependency completed.

    Polled with durable sleeps (0.1 s doubling to 5 s; 60 s while one failed),
    so a takeover resumes the wait instead of starting the function early. A
    completed run never changes again, so the gate, once passed, stays passed.
    """
    jobs = Jobs(ctx.store) if ctx.store is not None else None
    assert jobs is not None, "dependencies need a worker's store"
    delay = 0.1
    while True:
        done, broken = await ctx._durable(
            "rq.dependencies", lambda: jobs.dependencies_done(run_ids)
        )
        if done:
            return
        await ctx.sleep(DEPENDENCY_POLL_BROKEN if broken else delay)
        delay = min(delay * 2, DEPENDENCY_POLL_MAX)


def _quiet(fn: Any) -> Any:
    """The callback, returning None: its return value is not a run output to store."""

    def call(*args: Any) -> None:
        fn(*args)

    return call


async def call_rq_style(flow: Flow, ctx: Context) -> Any:
    state = ctx.run.state
    callbacks = state.get("callbacks") or {}
    assert isinstance(callbacks, dict)
    job = CallbackJob(
        id=ctx.run.id,
        func_name=flow.name.replace(":", "."),
        origin=ctx.run.queue,
        args=ctx.args,
        kwargs=ctx.kwargs,
        meta=ctx.run.meta,
        description=ctx.run.description,
    )
    if ctx.run.depends_on:
        await await_dependencies(ctx, list(ctx.run.depends_on))
    try:
        result = await ctx.step("call", flow.fn, *ctx.args, retry=rq_retry(state), **ctx.kwargs)
    except BaseException as exc:
        if not isinstance(exc, Exception) and not ctx.raised_by_user(exc):
            raise  # runfleet's own stop (cancel, shutdown, a park): not a failure
        name = callbacks.get("on_failure")
        if name:
            tb = "".join(traceback.format_exception(exc))
            on_failure = _quiet(resolve(str(name)).fn)
            await ctx.step("rq.on_failure", on_failure, job, None, type(exc), exc, tb)
        raise
    name = callbacks.get("on_success")
    if name:
        await ctx.step("rq.on_success", _quiet(resolve(str(name)).fn), job, None, result)
    return result
