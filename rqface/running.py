"""rq's view of a run a worker executes for a plain function: the job its function and its
callbacks see (``get_current_job()``), its ``depends_on`` wait, and a returned ``Retry``.

The worker hands the running flow (its ``FlowDeclaration``) and its context down; this
module reads them through ``RunningContext`` and imports nothing of the worker's. The
worker's own part (the step that calls the function under rq's retry policy, callbacks
resolved by its allow-list, what a stop runs) is worker/rq_compat.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from runfleet.declaration import FlowDeclaration
from runfleet.rqface.current import current_job
from runfleet.rqface.jobs import JobStatus, job_status
from runfleet.rqface.rq_api import refuse_pipeline
from runfleet.store import Store
from runfleet.store.jobs import Jobs
from runfleet.store.registries import Registries
from runfleet.store.steps import StepRecord
from runfleet.store.types import RunRow

T = TypeVar("T")


class Replaying(Protocol):
    """The replay bookkeeping of a run's activation, as far as rq's wait reads it."""

    def peek(self) -> StepRecord | None:
        """The record at the next position, without taking it."""
        ...

    async def durable(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A bookkeeping call, retried on transient errors."""
        ...


class RunningContext(Protocol):
    """What rq's semantics read of the context a worker runs a plain function with."""

    @property
    def run(self) -> RunRow: ...

    @property
    def store(self) -> Store | None: ...

    @property
    def args(self) -> list[Any]: ...

    @property
    def kwargs(self) -> dict[str, Any]: ...

    @property
    def replay(self) -> Replaying: ...

    async def sleep(self, duration: timedelta | float) -> None:
        """A durable sleep: recorded, replayed at once."""
        ...


@dataclass
class CallbackJob:
    """What an rq callback (and ``get_current_job()``) reads of its job.

    ``get_status`` answers as rq's does inside a callback: ``finished`` in ``on_success``,
    ``failed`` in ``on_failure`` (rq sets the status first, #1631), ``started`` in the
    function. ``refresh()``, ``save_meta()``, ``dependencies_are_met()`` reach the
    database through the worker's loop, from the function's thread.
    """

    id: str
    func_name: str
    origin: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    status: JobStatus = JobStatus.STARTED
    dependency_ids: list[str] = field(default_factory=list)
    allow_dependency_failures: bool = False
    _ctx: RunningContext | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def _run(self, make: Callable[[], Awaitable[T]]) -> T:
        assert self._ctx is not None and self._loop is not None

        async def call() -> T:
            return await make()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("a job's database reads are for sync functions (its thread)")
        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def get_status(self, refresh: bool = True) -> JobStatus:
        if not refresh or self._ctx is None or self.status is not JobStatus.STARTED:
            return self.status
        store = self._ctx.store
        assert store is not None
        row = self._run(lambda: store.runs.get(self.id))
        return job_status(row) if row is not None else self.status

    def save_meta(self) -> None:
        store = self._ctx.store if self._ctx is not None else None
        assert store is not None
        self._run(lambda: Jobs(store).save_meta(self.id, self.meta))

    def save(self, pipeline: Any = None, include_meta: bool = True) -> None:
        """rq's ``job.save()`` inside a job: what a job may change of itself is its ``meta``
        (its arguments and options are the durable admission), so it saves that."""
        refuse_pipeline(pipeline)
        if include_meta:
            self.save_meta()

    def dependencies_are_met(self) -> bool:
        store = self._ctx.store if self._ctx is not None else None
        assert store is not None
        registries = Registries(store)
        ids, allow = self.dependency_ids, self.allow_dependency_failures
        return self._run(lambda: registries.dependencies_met(ids, allow)).met


def job_of(
    flow: FlowDeclaration, ctx: RunningContext, status: JobStatus = JobStatus.STARTED
) -> CallbackJob:
    state = ctx.run.state
    ids = state.get("dependency_ids") or state.get("depends_on") or []
    loop = asyncio.get_running_loop()
    return CallbackJob(
        id=ctx.run.lineage_id if state.get("requeued_from") else ctx.run.id,
        func_name=flow.name.replace(":", "."),
        origin=ctx.run.queue,
        args=ctx.args,
        kwargs=ctx.kwargs,
        meta=ctx.run.meta,
        description=ctx.run.description,
        status=status,
        dependency_ids=[str(i) for i in ids] if isinstance(ids, list) else [],
        allow_dependency_failures=bool(state.get("allow_failure")),
        _ctx=ctx,
        _loop=loop,
    )


@contextmanager
def running_job(flow: FlowDeclaration, ctx: RunningContext) -> Iterator[None]:
    """``get_current_job()`` answers with this run while its plain function runs."""
    token = current_job.set(job_of(flow, ctx))
    try:
        yield
    finally:
        current_job.reset(token)


def wants_rq_call(flow: FlowDeclaration, ctx: RunningContext) -> bool:
    state = ctx.run.state
    options = ("retry", "callbacks", "depends_on", "job_timeout")
    return not flow.takes_context and any(state.get(k) for k in options)


DEPENDENCY_POLL_MAX = 5.0
"""Longest wait between two looks at open dependencies (seconds)."""
DEPENDENCY_POLL_BROKEN = 60.0
"""Between two looks while a dependency failed or was cancelled (rq leaves the job
deferred; a requeued dependency that then completes releases it)."""


async def await_dependencies(ctx: RunningContext, run_ids: list[str], allow_failure: bool) -> None:
    """rq's ``depends_on``: return once the dependencies are met.

    Polled with durable sleeps (0.1 s doubling to 5 s; 60 s while one failed),
    so a takeover resumes the wait instead of starting the function early. A replay
    first consumes the sleeps already recorded (the run waited through them) and only
    then looks live: the looks are not recorded, the sleeps are, so what a replay
    executes is what was recorded whatever the dependencies answer now. Met
    dependencies stay met (completed is final; a failure under allow_failure too).
    """
    store = ctx.store
    assert store is not None, "dependencies need a worker's store"
    registries = Registries(store)
    delay = 0.1
    while _recorded_sleep_next(ctx):
        await ctx.sleep(delay)  # replayed: returns at once with the recorded due time
        delay = min(delay * 2, DEPENDENCY_POLL_MAX)
    while True:
        met, broken = await ctx.replay.durable(
            "rq.dependencies", lambda: registries.dependencies_met(run_ids, allow_failure)
        )
        if met:
            return
        await ctx.sleep(DEPENDENCY_POLL_BROKEN if broken else delay)
        delay = min(delay * 2, DEPENDENCY_POLL_MAX)


def _recorded_sleep_next(ctx: RunningContext) -> bool:
    record = ctx.replay.peek()
    return record is not None and record.key.startswith("sleep:sleep#")


class MaxRetriesExceeded(Exception):
    """rq's: a job kept returning ``Retry`` past that ``Retry``'s ``max``: it fails."""


_RETRY_ASKED = "__rq_retry__"
"""The key of what a call that returned ``Retry`` answers (a step records it as JSON)."""


def _asking(result: Any) -> Any:
    """A returned rq ``Retry`` (runfleet's or rq's own: ``max`` and ``intervals``) as a
    JSON answer the retry loop reads; anything else as it is."""
    max_retries = getattr(result, "max", None)
    intervals = getattr(result, "intervals", None)
    if type(result).__name__ != "Retry" or not isinstance(max_retries, int):
        return result
    if not isinstance(intervals, list | tuple):
        intervals = [0]
    return {_RETRY_ASKED: {"max": max_retries, "intervals": [float(i) for i in intervals]}}


def asking_retry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` answering a returned ``Retry`` as the retry loop's JSON request."""
    if inspect.iscoroutinefunction(fn):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return _asking(await fn(*args, **kwargs))

        return call_async

    def call_sync(*args: Any, **kwargs: Any) -> Any:
        return _asking(fn(*args, **kwargs))

    return call_sync


async def retrying_returned(ctx: RunningContext, call: Callable[[], Awaitable[Any]]) -> Any:
    """rq's job that returns ``Retry(max=, interval=)``: run it again after the interval
    (a durable sleep) until it returns anything else; once it asked ``max`` times, the run
    fails with ``MaxRetriesExceeded``."""
    retries = 0
    while True:
        result = await call()
        asked = result.get(_RETRY_ASKED) if isinstance(result, dict) else None
        if not isinstance(asked, dict):
            return result
        max_retries = int(asked.get("max", 0))
        if retries >= max_retries:
            raise MaxRetriesExceeded(f"the job returned Retry(max={max_retries}) once too often")
        intervals = [float(i) for i in asked.get("intervals") or [0]]
        interval = intervals[min(retries, len(intervals) - 1)]
        retries += 1
        if interval > 0:
            await ctx.sleep(interval)
