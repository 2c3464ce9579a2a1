"""A stopping worker process always stops, whatever its runs' code left behind.

Run bodies share the process, and two things they can do outlive them: a thread that is
not a daemon (the interpreter's exit joins it, so the process would live on after its
stop for as long as that thread did), and a signal disposition (``signal.signal(SIGTERM,
SIG_IGN)`` from an async body, which runs on the loop's thread, would take the worker's
shutdown away). ``StopGuard`` keeps the process's own answer to SIGTERM/SIGINT and ends
it: it puts the worker's handlers back whenever it finds them changed or the signals
blocked (checked every ``KEEP_S`` on the loop), and from the first stop (a signal, or the
worker ending by itself) a daemon thread that needs nothing of the loop ends the process
with ``os._exit`` at ``Settings.stop_deadline``. The graceful path (grace, then release)
runs first; when it is done the process exits at once, never joining what bodies left.
A process ended by the deadline holds no lease any more once it is gone: its runs are
taken over as after a kill (the probe finds its pid dead).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger("runfleet.worker.stopping")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
KEEP_S = 0.1
"""How often the loop checks that the worker's signal handlers are still its own: a body
that ignores SIGTERM loses it for at most this long (a signal sent while it is ignored is
discarded by the kernel)."""
STOP_OVERDUE_EXIT = 70
"""Exit status of a process the deadline ended (EX_SOFTWARE: what it ran would not stop)."""


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` now: logs flushed, no thread joined, no atexit."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing more to say on it
            pass
    os._exit(code)


class StopGuard:
    """The process's handlers for SIGTERM/SIGINT, kept, and a deadline once stopping."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_signal: Callable[[], None],
        deadline_s: float,
        *,
        exit: Callable[[int], object] = exit_now,
    ) -> None:
        self._loop = loop
        self._on_signal = on_signal
        self._deadline_s = deadline_s
        self._exit = exit
        self._installed: dict[signal.Signals, object] = {}
        self._armed = threading.Event()
        self._keeper: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Handle SIGTERM/SIGINT on the loop, and keep handling them."""
        for sig in SIGNALS:
            self._loop.add_signal_handler(sig, self._signalled)
            self._installed[sig] = signal.getsignal(sig)
        self._keeper = self._loop.call_later(KEEP_S, self._keep)

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None

    def _signalled(self) -> None:
        self.arm()
        self._on_signal()

    def _keep(self) -> None:
        """Put back what a run's code changed: a handler, an ignore, a blocked signal."""
        changed: list[str] = []
        for sig, mine in self._installed.items():
            now = signal.getsignal(sig)
            if now != mine:
                changed.append(f"{sig.name}={now!r}")
                self._loop.add_signal_handler(sig, self._signalled)
                self._installed[sig] = signal.getsignal(sig)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(SIGNALS)
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
            changed.extend(f"{signal.Signals(sig).name}=blocked" for sig in blocked)
        if changed:
            log.warning("worker.signals_restored", extra={"found": changed})
        self._keeper = self._loop.call_later(KEEP_S, self._keep)

    def arm(self) -> None:
        """From now on the process ends by ``deadline_s`` from now, whatever. Idempotent."""
        if self._armed.is_set():
            return
        self._armed.set()
        started = time.monotonic()

        def deadline() -> None:
            time.sleep(max(0.0, self._deadline_s - (time.monotonic() - started)))
            left = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
            log.error(
                "worker.stop_overdue",
                extra={"deadline_s": self._deadline_s, "threads": left, "pid": os.getpid()},
            )
            self._exit(STOP_OVERDUE_EXIT)

        threading.Thread(target=deadline, name="runfleet-stop-deadline", daemon=True).start()
