"""Wake hints for runs this process parked on a timer due soon.

The due-clock sweep wakes every parked timer, but only once per ``sweep_interval``
(1 s by default), so a one-second sleep would wake up to a second late. The process
that parked a run knows when it is due: it asks for a wake (a stream message, like any
other) at that moment. The hint is only a hint: if it is lost with the process, or
arrives a moment before the database clock says the timer is due, the run stays parked
and the sweep wakes it. A hint that arrives after the sweep is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from runfleet.store.types import RunRow

log = logging.getLogger("runfleet.worker.wake_hints")

HORIZON_S = 60.0
"""Timers due later than this are left to the sweep: no timer handle is held for them."""

MARGIN_S = 0.01
"""Fire this much after the due time, so the database clock has passed it too."""

HintFn = Callable[[RunRow], Awaitable[None]]
"""Hint that a run can move (released, a child admitted, a parent woken, a timer due):
``Outbox.hint`` publishes a stream message a worker claims it from. Only a hint —
the sweeps find the run anyway if it is lost. Defined once for the driver, the
settlement, the context and the wake hints."""


class WakeHints:
    def __init__(self, wake: HintFn | None) -> None:
        self._wake = wake
        self._tasks: set[asyncio.Task[None]] = set()

    def arm(self, row: RunRow, due_monotonic: float | None) -> None:
        """Ask for a wake of ``row`` at ``due_monotonic`` (``time.monotonic()`` clock)."""
        if self._wake is None or due_monotonic is None:
            return
        delay = due_monotonic - time.monotonic() + MARGIN_S
        if delay > HORIZON_S:
            return
        asyncio.get_running_loop().call_later(max(0.0, delay), self._fire, row)

    def _fire(self, row: RunRow) -> None:
        task = asyncio.ensure_future(self._send(row))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, row: RunRow) -> None:
        assert self._wake is not None
        try:
            await self._wake(row)
        except Exception as exc:  # the sweep wakes it instead
            log.warning("wake_hint.failed", extra={"run_id": row.id, "error": repr(exc)})
