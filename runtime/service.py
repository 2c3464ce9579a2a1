"""One lifecycle for every long-lived service: start, stop, wait for either edge.

River's ``startstop`` is the model. ``start`` launches a service's body and returns;
``stop`` asks the body to end and returns at once. Both are idempotent, and stopping a
service that never started is harmless, so a shutdown path stops everything it may have
started without tracking what it did. ``wait_started`` / ``wait_stopped`` wait for either
edge. A service runs once: ``start`` after ``stop`` does nothing.

A failure is loud. Started inside a ``TaskGroup`` (``start(group)``), the body is one of
the group's tasks, so a body that raises ends the group: the worker stops instead of
limping on without its lease or its sweeps (STYLE rule 7). Started alone, the failure is
logged (``service.crashed``) and raised again by ``wait_stopped``.

Tests wait on ``Signal``s that a service fires at the points worth waiting for (a renewal,
a lapse, a sweep pass) instead of polling its state — River's ``TestSignals``. Production
passes no signals; a service then pays one ``None`` check per point.

It lives in ``runtime`` (runfleet/runtime/), beside the layers rather than in one of them:
``broker.notify.Subscription`` is a service as much as the worker's lease and sweeps are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("runfleet.service")

T = TypeVar("T")

SIGNAL_WAIT_S = 10.0
"""How long a test waits for a signal by default: generous for a loaded 2-core host."""


class Lifecycle(Protocol):
    """What every service offers, whether its body is an asyncio task or a thread."""

    def start(self, group: asyncio.TaskGroup | None = None) -> None:
        """Launch the body (in ``group`` if given); a no-op if already started or stopped."""

    def stop(self) -> None:
        """Ask the body to end; harmless twice or before ``start``. Does not wait."""

    async def wait_started(self, timeout: float | None = None) -> bool:
        """True once the body runs; False if it did not within ``timeout``."""

    async def wait_stopped(self, timeout: float | None = None) -> bool:
        """True once the body has ended (at once if it never started); False after ``timeout``."""


class Service:
    """An asyncio service: a subclass writes ``_serve``, which returns soon after ``stop()``.

    ``_serve`` watches ``self._stopping`` (``_pause`` sleeps until it is set) and lets
    whatever it raises escape: catching what a pass may survive is the subclass's
    business, anything else ends the service — and, started in a group, the group.
    """

    name = "service"
    """The task's name (``runfleet-<name>``) and the ``service`` field of its log lines."""

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    async def _serve(self) -> None:
        raise NotImplementedError

    # ---- the lifecycle ---------------------------------------------------------

    def start(self, group: asyncio.TaskGroup | None = None) -> None:
        if self._task is not None or self._started.is_set():
            return
        spawn = group.create_task if group is not None else asyncio.create_task
        task = spawn(self._main(), name=f"runfleet-{self.name}")
        self._task = task
        task.add_done_callback(self._ended)

    def stop(self) -> None:
        if self._task is None and not self._started.is_set():
            return  # never started: nothing to stop, and a later start still runs
        self._stopping.set()

    @property
    def running(self) -> bool:
        """Started and not yet ended."""
        return self._started.is_set() and not self._stopped.is_set()

    async def wait_started(self, timeout: float | None = None) -> bool:
        return await within(self._started, timeout)

    async def wait_stopped(self, timeout: float | None = None) -> bool:
        """True once the body has ended; raises what the body raised if it crashed."""
        if self._task is None and not self._started.is_set():
            return True
        if not await within(self._stopped, timeout):
            return False
        if self._failure is not None:
            raise self._failure
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Serve in the caller's task until ``stop`` is set, then return.

        The transition step for callers written against ``run(stop_event)`` (a worker's
        TaskGroup side tasks): a failure propagates to the caller's task exactly as a
        side task's did. A ``stop`` already set means no pass at all.
        """
        if self._task is not None or self._started.is_set():
            raise RuntimeError(f"{self.name} already started")
        if stop.is_set():
            self._stopping.set()
        relay = asyncio.create_task(self._relay(stop), name=f"runfleet-{self.name}-stop")
        try:
            await self._main()
        finally:
            relay.cancel()
            self._stopped.set()

    # ---- for subclasses ----------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until ``stop()``; True if the service is stopping.

        A task asked to cancel counts as stopping too: a client library can lose the
        ``CancelledError`` that arrived in one of its calls (redis-py, now and then, turns
        it into a connection error that a pass survives), and the group that cancelled
        this service after a sibling crashed would otherwise wait for it forever.
        """
        if seconds > 0 and not self._stopping.is_set() and not cancel_requested():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stopping.wait()
        return self._stopping.is_set() or cancel_requested()

    async def _until_stopped(self, work: Awaitable[None]) -> None:
        """Run ``work`` (a loop that never returns on its own) until ``stop()``, then cancel it.

        What ``work`` raises before that propagates.
        """
        body = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({body, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await body

    # ---- internals -------------------------------------------------------------------

    async def _main(self) -> None:
        self._started.set()
        try:
            if not self._stopping.is_set():
                await self._serve()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failure = exc
            log.error(
                "service.crashed",
                extra={"service": self.name, "error": repr(exc)},
                exc_info=exc,
            )
            raise

    async def _relay(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._started.set()  # a task cancelled before its first step never ran _main
        self._stopped.set()
        if not task.cancelled():
            task.exception()  # kept in _failure; retrieved so asyncio does not warn


def cancel_requested() -> bool:
    """Whether the running task has a cancel it has not taken back (``Task.cancelling``)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Signal(Generic[T]):
    """A point a service reached, kept until a test takes it (River's ``TestSignal``).

    Each ``fire`` is queued, so a test never misses an edge that happened before it
    began to wait. Thread-safe: the watchdog fires from its own thread.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._values: deque[T] = deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.count = 0
        """How many times it fired (taken or not)."""

    def fire(self, value: T) -> None:
        with self._cond:
            self._values.append(value)
            self.count += 1
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, future)

    def clear(self) -> None:
        """Drop what fired and was not taken: wait for the next edge, not an earlier one."""
        with self._cond:
            self._values.clear()

    async def wait(self, timeout: float = SIGNAL_WAIT_S) -> T:
        """The oldest value not yet taken; ``TimeoutError`` if none comes within ``timeout``."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                with self._cond:
                    if self._values:
                        return self._values.popleft()
                    future: asyncio.Future[None] = loop.create_future()
                    self._waiters.append((loop, future))
                await future

    async def until(self, check: Callable[[T], bool], timeout: float = SIGNAL_WAIT_S) -> T:
        """Take values until one passes ``check``; ``TimeoutError`` after ``timeout`` in all."""
        async with asyncio.timeout(timeout):
            while not check(value := await self.wait(timeout)):
                pass
            return value

    def wait_blocking(self, timeout: float = SIGNAL_WAIT_S) -> T:
        """``wait`` for a caller without an event loop (a test of a thread service)."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._values), timeout):
                raise TimeoutError(f"no signal within {timeout} s")
            return self._values.popleft()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def within(event: asyncio.Event, timeout: float | None) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
