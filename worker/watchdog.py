"""Fail-stop: end the process when a run keeps executing past the point the lease protects.

The lease loop interrupts every run once renewals stop being confirmed (the lapse),
but an interrupt only reaches code that yields to the event loop: a sync step in a
thread or CPU-bound code that blocks the loop cannot be stopped. Such a process must
not be executing when another worker may take its runs over, so this thread — which
does not depend on the event loop — exits the process once the last confirmed renewal
is ``settings.failstop_after`` old while a run body is still executing, and it has seen
that for ``settings.failstop_confirm`` itself (a process thawed after SIGSTOP wakes up
overdue, and its lapse loop stops async bodies within that window). Both together stay
under ``stale_after``. The supervisor restarts the process under a new owner identity.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runfleet.runtime.service import Signal

log = logging.getLogger("runfleet.worker.watchdog")

FAILSTOP_EXIT = 75
"""Exit status of a fail-stop (EX_TEMPFAIL): the supervisor restarts the process."""


@dataclass(frozen=True)
class WatchdogSignals:
    """Points of the watchdog a test waits on instead of polling (``runtime.service.Signal``).

    Fired from the watchdog's thread: a test without an event loop uses ``wait_blocking``.
    """

    overdue: Signal[float] = field(default_factory=Signal)
    """A run is executing past the fail-stop point (seconds late): the confirm window opens."""
    spared: Signal[None] = field(default_factory=Signal)
    """The runs stopped (or a renewal was confirmed) inside the confirm window: no exit."""
    failstop: Signal[float] = field(default_factory=Signal)
    """The process is about to exit (seconds late)."""


class Watchdog:
    """A daemon thread polling two plain values the event loop maintains.

    ``confirmed_sent`` returns the monotonic send time of the newest confirmed renewal
    (None before the first); ``executing`` returns how many run bodies may still run.
    Both are read without locks: each is one attribute read under the GIL.

    A service (``runtime.service.Lifecycle``) whose body is a thread, because it must run
    while the event loop is blocked: ``start`` ignores a task group (a thread cannot end
    one, and its only failure mode is to end the process), and ``stop`` also joins the
    thread, briefly, since the poll wakes at once.
    """

    def __init__(
        self,
        *,
        confirmed_sent: Callable[[], float | None],
        executing: Callable[[], int],
        failstop_after: float,
        confirm: float = 0.0,
        poll: float = 0.02,
        exit: Callable[[int], object] = os._exit,
        signals: WatchdogSignals | None = None,
    ) -> None:
        self._confirmed_sent = confirmed_sent
        self._executing = executing
        self._failstop_after = failstop_after
        self._confirm = confirm
        self._poll = poll
        self._exit = exit
        self._signals = signals
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    def start(self, group: asyncio.TaskGroup | None = None) -> None:
        """Start the thread; a no-op once started (a watchdog runs once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="runfleet-watchdog", daemon=True)
        self._thread.start()
        self._started.set()

    def stop(self) -> None:
        """Stop watching; harmless twice, and before ``start`` (a later start still runs)."""
        if self._thread is None:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    async def wait_started(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self._started.wait, timeout)

    async def wait_stopped(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is None:
            return True
        await asyncio.to_thread(thread.join, timeout)
        return not thread.is_alive()

    def overdue(self) -> float | None:
        """Seconds past the fail-stop point with a run still executing, else None."""
        sent = self._confirmed_sent()
        if sent is None or self._executing() == 0:
            return None
        late = time.monotonic() - sent - self._failstop_after
        return late if late >= 0 else None

    def _watch(self) -> None:
        seen_since: float | None = None
        while not self._stop.wait(self._poll):
            late = self.overdue()
            if late is None:
                if seen_since is not None and self._signals is not None:
                    self._signals.spared.fire(None)
                seen_since = None
                continue
            now = time.monotonic()
            if seen_since is None:
                seen_since = now
                if self._signals is not None:
                    self._signals.overdue.fire(late)
            if now - seen_since < self._confirm:
                continue
            self.fired = True
            if self._signals is not None:
                self._signals.failstop.fire(late)
            # Logging from this thread is safe; the handlers may be blocked behind the
            # frozen loop only if they share its lock, so write to stderr directly too.
            message = (
                f"worker.failstop: a run is still executing {self._failstop_after + late:.2f} s "
                "after the last confirmed lease renewal was sent; exiting before the lease can "
                "turn stale\n"
            )
            try:
                sys.stderr.write(message)
                sys.stderr.flush()
                log.critical("worker.failstop", extra={"late_s": round(late, 3)})
            finally:
                self._exit(FAILSTOP_EXIT)
            return
