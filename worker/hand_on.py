"""A run of a version this worker does not carry: its wake handed on to the fleet.

During a rolling deploy workers of two versions read the same stream, and a run's wake
reaches whichever is reading. A worker that cannot run the run's version
(``worker.authoring.versions``: ``run.version_not_carried``) publishes the wake again at once, on
the recovery lane that every worker reads before its backlog (the run keeps its place
in line), so a worker that carries the version takes the run now rather than at the
lost-wake sweep.
Bounded so that workers of the wrong version cannot pass a run between them at full
speed while none of the right one is reading: this process hands a given run on at
once the first time, then after 50 ms, 100 ms, ... doubling up to ``MAX_DELAY_S``, and
holds at most one hand-on per run at a time (a wake arriving meanwhile is dropped: the
scheduled one covers it), and no more than ``PER_SECOND`` hand-ons a second in all
(past that, a wake is left to the lost-wake sweep, as before hand-ons existed).
``run.version_handed_on`` is logged at the first hand-on of
a run (then at debug level).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from runfleet.store.types import RunRow, RunStatus
from runfleet.worker.authoring.versions import admitted_version
from runfleet.worker.wake_hints import HintFn

log = logging.getLogger("runfleet.worker.flows")

FIRST_DELAY_S = 0.05
"""The second hand-on of a run from this process waits this long; each next one twice."""
MAX_DELAY_S = 1.0
"""The longest wait between two hand-ons of one run from this process."""
KEPT = 10_000
"""Runs whose hand-on count this process remembers (forgotten all at once past it)."""
PER_SECOND = 100
"""The most hand-ons this process sends a second, all runs together (a burst of as many):
a backlog of runs of a version no live worker carries costs the fleet a bounded trickle
of wakes and reads, and the lost-wake sweep covers the runs past it."""


class HandOn:
    """Hands on the wakes of runs of versions this process does not carry."""

    def __init__(self, hint: HintFn) -> None:
        self._hint = hint
        self._hops: dict[str, int] = {}
        self._scheduled: dict[str, asyncio.Task[None]] = {}
        self._tokens = float(PER_SECOND)
        self._refilled = time.monotonic()

    def delay(self, hops: int) -> float:
        """How long the hand-on after ``hops`` earlier ones waits."""
        return 0.0 if hops == 0 else min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (hops - 1))

    def wake(self, row: RunRow, carried: Any) -> None:
        """Hand on the wake of ``row`` (a version this process does not carry)."""
        if row.status is not RunStatus.PENDING or row.waiting is not None:
            return  # only a run ready to be claimed: a waiting one is woken by its cause
        if row.id in self._scheduled or not self._spend():
            return
        if len(self._hops) >= KEPT:
            self._hops.clear()
        hops = self._hops.get(row.id, 0)
        self._hops[row.id] = hops + 1
        delay = self.delay(hops)
        fields = {
            "run_id": row.id,
            "flow": row.flow,
            "version": admitted_version(row),
            "carried": carried,
            "hop": hops + 1,
            "delay_s": delay,
        }
        if hops == 0:
            log.info("run.version_handed_on", extra=fields)
        else:
            log.debug("run.version_handed_on", extra=fields)
        task = asyncio.get_running_loop().create_task(self._send(row, delay))
        self._scheduled[row.id] = task
        task.add_done_callback(lambda _t: self._scheduled.pop(row.id, None))

    def _spend(self) -> bool:
        """Take one hand-on from this process's budget (``PER_SECOND``); False if spent."""
        now = time.monotonic()
        self._tokens = min(PER_SECOND, self._tokens + (now - self._refilled) * PER_SECOND)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def _send(self, row: RunRow, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        try:
            await self._hint(row)
        except Exception as exc:  # a hint: the lost-wake sweep covers it
            log.warning("run.version_hand_on_failed", extra={"run_id": row.id, "error": repr(exc)})

    def close(self) -> None:
        """A stopping worker hands nothing more on (the sweep covers what was due)."""
        for task in list(self._scheduled.values()):
            task.cancel()
