"""rq's ``job_timeout`` for a plain function a worker runs: ``JobTimeoutException`` once it
ran that long (a coroutine is cancelled; a sync call gets the exception raised in its thread)."""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from runfleet.rqface.rq_api import DEFAULT_JOB_TIMEOUT, JobTimeoutException


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
