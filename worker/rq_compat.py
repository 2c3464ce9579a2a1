"""rq's per-job options for plain functions: ``retry=Retry(max, interval)``, the
``on_success`` / ``on_failure`` callbacks and ``depends_on``, as a producer gave them
at enqueue (producer/admission.py).

A run with ``depends_on`` first waits, durably, until its dependencies are met
(``await_dependencies``, rq's ``dependencies_are_met``: completed, or failed under
``Dependency(allow_failure=True)``); otherwise a failed or cancelled dependency leaves it
waiting, as rq leaves a job deferred. The wait is its durable sleeps: a replay consumes the
recorded ones before it looks again, so a run that waited and then woke to met
dependencies replays the same calls (the A <- B <- C chain once failed its last job with
NonDeterminism when the live look at replay skipped the recorded sleeps).

Every plain function runs with rq's ``get_current_job()`` answering (``CurrentJob``).

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

import asyncio
import ctypes
import heapq
import inspect
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runfleet.rqface.current import current_job
from runfleet.rqface.jobs import JobStatus, job_status
from runfleet.rqface.rq_api import DEFAULT_JOB_TIMEOUT, JobTimeoutException, refuse_pipeline
from runfleet.store.registries import Registries
from runfleet.worker.context import Context
from runfleet.worker.durable import Retry
from runfleet.worker.flows import Flow, resolve
from runfleet.worker.outcomes import Cause
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


T = TypeVar("T")
log = logging.getLogger("runfleet.worker.rq")


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
    _ctx: Context | None = field(default=None, repr=False)
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
        from runfleet.store.jobs import Jobs

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


def job_of(flow: Flow, ctx: Context, status: JobStatus = JobStatus.STARTED) -> CallbackJob:
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
def running_job(flow: Flow, ctx: Context) -> Iterator[None]:
    """``get_current_job()`` answers with this run while its plain function runs."""
    token = current_job.set(job_of(flow, ctx))
    try:
        yield
    finally:
        current_job.reset(token)


def wants_rq_call(flow: Flow, ctx: Context) -> bool:
    state = ctx.run.state
    options = ("retry", "callbacks", "depends_on", "job_timeout")
    return not flow.takes_context and any(state.get(k) for k in options)


def job_timeout(state: dict[str, Any]) -> float | None:
    """rq's ``job_timeout`` of a plain function in seconds: the one it was enqueued with
    (None for rq's -1: none), else rq's default, ``DEFAULT_JOB_TIMEOUT``."""
    value = state.get("job_timeout")
    if value is None:
        return float(DEFAULT_JOB_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


class _Deadline:
    """One sync call's job timeout, armed in ``Deadlines``."""

    __slots__ = ("done", "thread_id")

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.done = False


class Deadlines:
    """The job timeouts of this process's sync calls, watched by one thread.

    A thread per call (``threading.Timer``) costs more than a no-op job; here arming is a
    heap push under a lock. At its deadline a call still running gets
    ``JobTimeoutException`` raised in its thread. Disarmed entries leave the heap when
    they reach its top, or all at once when they are most of it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._disarmed = 0
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> _Deadline:
        deadline = _Deadline(threading.get_ident())
        with self._cond:
            due = time.monotonic() + seconds
            heapq.heappush(self._heap, (due, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="runfleet-job-timeouts", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is deadline:
                self._cond.notify()
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        """The call ended: its deadline can no longer fire (under the same lock)."""
        with self._cond:
            if deadline.done:
                return
            deadline.done = True
            self._disarmed += 1
            if self._disarmed > 64 and self._disarmed * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                self._disarmed = 0

    def _watch(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._disarmed = max(0, self._disarmed - 1)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, deadline = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                deadline.done = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(deadline.thread_id), ctypes.py_object(JobTimeoutException)
                )


DEADLINES = Deadlines()


def timed(fn: Callable[..., Any], seconds: float | None) -> Callable[..., Any]:
    """``fn`` failing with rq's ``JobTimeoutException`` once it ran ``seconds``.

    A coroutine function is cancelled at the timeout. A sync function runs in a worker
    thread that cannot be stopped from outside: the exception is raised in that thread
    (as rq's SIGALRM raises it in its work horse), which Python delivers at the next
    bytecode the thread executes, so a blocking C call (a long ``time.sleep``, a socket
    read) ends first and only then fails. The run's slot is held until it does.
    """
    if seconds is None:
        return fn
    if inspect.iscoroutinefunction(fn):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                async with asyncio.timeout(seconds):
                    return await fn(*args, **kwargs)
            except TimeoutError:
                raise _timeout_error(seconds) from None

        return run_async

    def run_sync(*args: Any, **kwargs: Any) -> Any:
        deadline = DEADLINES.arm(seconds)
        try:
            return fn(*args, **kwargs)
        except JobTimeoutException:
            raise _timeout_error(seconds) from None
        finally:
            DEADLINES.disarm(deadline)

    return run_sync


def _timeout_error(seconds: float) -> JobTimeoutException:
    shown = int(seconds) if seconds.is_integer() else seconds
    return JobTimeoutException(f"Task exceeded maximum timeout value ({shown} seconds)")


DEPENDENCY_POLL_MAX = 5.0
"""Longest wait between two looks at open dependencies (seconds)."""
DEPENDENCY_POLL_BROKEN = 60.0
"""Between two looks while a dependency failed or was cancelled (rq leaves the job
deferred; a requeued dependency that then completes releases it)."""


async def await_dependencies(ctx: Context, run_ids: list[str], allow_failure: bool) -> None:
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


def _recorded_sleep_next(ctx: Context) -> bool:
    record = ctx.replay.peek()
    return record is not None and record.key.startswith("sleep:sleep#")


def _quiet(fn: Any) -> Any:
    """The callback, returning None: its return value is not a run output to store."""

    def call(*args: Any) -> None:
        fn(*args)

    return call


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


async def retrying_returned(ctx: Context, call: Callable[[], Awaitable[Any]]) -> Any:
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
        import builtins

        return getattr(builtins, name.partition(":")[2])
    return resolve(name).fn
