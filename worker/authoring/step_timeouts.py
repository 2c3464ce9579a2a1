"""Step timeouts: ``ctx.step(name, fn, timeout=…)`` bounds one attempt of a step.

An async step is cancelled at its timeout. A sync step cannot be stopped from outside its
thread, so at its timeout the thread is *abandoned*: its result no longer counts, the
attempt fails with ``StepTimeout`` and is retried under the step's own ``Retry`` policy
(``StepTimeout`` is an Exception: the default policy retries it). An abandoned thread
is still executing user code, so it is accounted for: ``ABANDONED`` counts it (the
``runfleet_abandoned_step_threads`` gauge), the fail-stop watchdog counts it as a body
still executing (``Driver.running_user_code``: a process whose lease lapses while one runs
exits before another worker can take its runs), and its end is logged.

Each attempt gets the full timeout; attempts are numbered in the database, so a step
whose worker is SIGKILLed mid-attempt is timed again, from zero, on the next owner.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import runfleet.worker.metrics as metrics
from runfleet.store.errors import InvalidInput

log = logging.getLogger("runfleet.flow")


class StepTimeout(TimeoutError):
    """One attempt of a step ran past its ``timeout`` (the attempt's recorded error)."""

    def __init__(self, key: str, timeout: float, abandoned: bool) -> None:
        how = "its thread abandoned" if abandoned else "cancelled"
        super().__init__(f"step {key!r} timed out after {timeout:g} s ({how})")
        self.key = key
        self.timeout = timeout
        self.abandoned = abandoned


class StepThread:
    """One timed sync step's thread, as ``AbandonedThreads`` tracks it."""

    __slots__ = ("ended", "key", "run_id")

    def __init__(self, run_id: str, key: str) -> None:
        self.run_id = run_id
        self.key = key
        self.ended = False


class AbandonedThreads:
    """The sync step threads this process gave up waiting for that are still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[StepThread] = set()

    def count(self) -> int:
        """How many are still running (read by the watchdog thread: one set's length)."""
        return len(self._running)

    def add(self, step: StepThread) -> bool:
        """Count ``step`` as abandoned; False if its thread ended meanwhile (nothing to count)."""
        with self._lock:
            if step.ended:
                return False
            self._running.add(step)
        metrics.ABANDONED_STEP_THREADS.set(self.count())
        return True

    def ended(self, step: StepThread) -> None:
        """``step``'s thread is ending (called from it, last)."""
        with self._lock:
            step.ended = True
            was = step in self._running
            self._running.discard(step)
        if was:
            metrics.ABANDONED_STEP_THREADS.set(self.count())
            log.warning(
                "step.abandoned_thread_ended", extra={"run_id": step.run_id, "step": step.key}
            )


ABANDONED = AbandonedThreads()


def checked_timeout(timeout: object) -> float:
    """``timeout`` as seconds; InvalidInput unless a finite number > 0."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidInput("timeout", f"must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


async def call_with_timeout(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    timeout: float,
    run_id: str,
    key: str,
) -> Any:
    """One attempt of ``fn`` bounded by ``timeout`` seconds; StepTimeout past it."""
    if inspect.iscoroutinefunction(fn):
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                return await fn(*args, **kwargs)
        except TimeoutError:
            if scope.expired():
                raise StepTimeout(key, timeout, abandoned=False) from None
            raise  # the step's own TimeoutError
    return await _in_own_thread(fn, args, kwargs, timeout=timeout, run_id=run_id, key=key)


async def _in_own_thread(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    timeout: float,
    run_id: str,
    key: str,
) -> Any:
    """``fn`` on a thread of its own (an abandoned one must not hold an executor slot).

    A cancel (the run interrupted) waits for the thread as ``worker.threads.in_thread``
    does, but no longer than the timeout: then the thread is abandoned and the cancel
    goes on.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if done.done():
            return
        if ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def body() -> None:
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # the step's, whatever it is: the attempt's error
            _deliver(loop, settle, False, exc)
        else:
            _deliver(loop, settle, True, value)
        finally:
            ABANDONED.ended(tracked)

    tracked = StepThread(run_id, key)
    thread = threading.Thread(target=body, name=f"runfleet-step {key}", daemon=True)
    deadline = time.monotonic() + timeout
    thread.start()
    cancelled: asyncio.CancelledError | None = None
    while not done.done():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            await asyncio.wait({done}, timeout=left)
        except asyncio.CancelledError as exc:
            cancelled = exc  # absorbed until the thread ends or its time is up
    if done.done():
        if cancelled is not None:
            if not done.cancelled():
                done.exception()  # retrieved: its result no longer matters
            raise cancelled
        return done.result()
    if not ABANDONED.add(tracked):  # it ended just now: take its answer after all
        await asyncio.wait({done})
        if cancelled is not None:
            raise cancelled
        return done.result()
    log.warning(
        "step.thread_abandoned",
        extra={"run_id": run_id, "step": key, "timeout_s": timeout, "abandoned": ABANDONED.count()},
    )
    if cancelled is not None:
        raise cancelled
    raise StepTimeout(key, timeout, abandoned=True)


def _deliver(
    loop: asyncio.AbstractEventLoop, settle: Callable[[bool, Any], None], ok: bool, value: Any
) -> None:
    try:
        loop.call_soon_threadsafe(settle, ok, value)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for this thread any more
