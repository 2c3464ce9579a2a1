"""One drive per run at a time in this process; wakes for a run already in a drive coalesce."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from runfleet.worker.driver import Driver
from runfleet.worker.outcomes import Decision

log = logging.getLogger("runfleet.worker.coordinator")

DecideFn = Callable[[], Awaitable[Decision]]
"""How a drive's first decision is made: the path its wake came by (``Decider``)."""


class Coordinator:
    """Keyed scheduling of drives.

    ``drive`` starts a drive unless one is active for that run, in which case
    the wake is remembered and one more drive follows the current one — so a wake
    that arrives mid-drive is never lost, and a burst of wakes costs one drive.
    Once ``close``d (the worker is stopping) it starts no drive and repeats none: a
    wake coalesced into a drive that then released its run must not claim it again.
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._active: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._batches: set[asyncio.Task[dict[str, Decision]]] = set()
        self.changed = asyncio.Event()
        self.closed = False

    def close(self) -> None:
        """Start no drive from now on, and repeat none (the worker is stopping)."""
        self.closed = True
        self._again.clear()

    def active(self) -> int:
        return len(self._active)

    def driving(self, run_id: str) -> bool:
        """A drive of ``run_id`` is under way here (a wake for it now coalesces into it)."""
        return run_id in self._active

    def drive(
        self,
        run_id: str,
        on_decided: Callable[[], None] | None = None,
        delivered_flow: str | None = None,
        *,
        peeked: bool = False,
    ) -> bool:
        """Start (or coalesce into) a drive of ``run_id``; True if a new drive started.

        ``delivered_flow``: the flow a stream message named (``Decider.delivered``); ``peeked``:
        that message came from an idle wait's doorbell (``Decider.delivered``). Closed:
        nothing starts and ``on_decided`` is not called (the delivery is not acknowledged)."""
        if self.closed:
            return False
        if run_id in self._active:
            self._again.add(run_id)
            if on_decided is not None:
                on_decided()
            return False
        decider = self._driver.decider
        decide: DecideFn = (
            partial(decider.decide, run_id)
            if delivered_flow is None
            else partial(decider.delivered, run_id, delivered_flow, peeked=peeked)
        )
        task = asyncio.create_task(self._run(run_id, on_decided, decide), name=f"drive:{run_id}")
        self._active[run_id] = task
        self.changed.set()
        return True

    def drive_many(self, items: Sequence[tuple[str, Callable[[], None] | None, str]]) -> int:
        """``drive`` for everything one stream read delivered (run id, its ack, the flow
        its message named); the runs not already in a drive are decided together
        (``Decider.decide_many``: one read, one claim statement), a lone one by one
        statement that reads and claims. Returns how many new drives started."""
        if self.closed:
            return 0
        fresh: list[tuple[str, Callable[[], None] | None]] = []
        flows: dict[str, str] = {}
        seen: set[str] = set()
        for run_id, on_decided, flow in items:
            if run_id in self._active or run_id in seen:
                self._again.add(run_id)
                if on_decided is not None:
                    on_decided()
                continue
            fresh.append((run_id, on_decided))
            flows[run_id] = flow
            seen.add(run_id)
        if not fresh:
            return 0
        if len(fresh) == 1:  # an idle worker's read: the one-run path is the shortest
            run_id, on_decided = fresh[0]
            return int(self.drive(run_id, on_decided, flows[run_id]))
        batch = self._decide_many([run_id for run_id, _ in fresh])
        decider = self._driver.decider
        for run_id, on_decided in fresh:
            self._active[run_id] = asyncio.create_task(
                self._run(run_id, on_decided, partial(decider.from_batch, run_id, batch)),
                name=f"drive:{run_id}",
            )
        self.changed.set()
        return len(fresh)

    def _decide_many(self, run_ids: list[str]) -> asyncio.Task[dict[str, Decision]]:
        """The shared decision of one read's runs; kept here until done (its drives await it)."""
        task = asyncio.get_running_loop().create_task(
            self._driver.decider.decide_many(run_ids), name="decide-many"
        )
        self._batches.add(task)
        task.add_done_callback(self._batch_done)
        return task

    def _batch_done(self, task: asyncio.Task[dict[str, Decision]]) -> None:
        self._batches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Each run of the batch is then decided alone by its own drive.
            log.warning("run.batch_decide_failed", extra={"error": repr(task.exception())})

    async def _run(
        self, run_id: str, on_decided: Callable[[], None] | None, decide: DecideFn
    ) -> None:
        """Decide (the first time by the path the wake came by, then from a fresh read),
        acknowledge the wake once decided, and hand the decision to the driver."""
        decider = self._driver.decider
        try:
            while True:
                try:
                    try:
                        decision = await decide()
                    finally:
                        if on_decided is not None:
                            on_decided()
                    if not self._hand_over(run_id, decision):
                        await self._driver.run_decided(decision)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Infrastructure errors land here (the database went away mid-drive).
                    # The run stays durable; a sweep or a later wake drives it again.
                    log.exception("run.drive_failed", extra={"run_id": run_id})
                on_decided = None  # again: read first
                decide = partial(decider.decide, run_id)
                if self.closed or run_id not in self._again:
                    return
                self._again.discard(run_id)
        finally:
            self._active.pop(run_id, None)
            self.changed.set()

    def _hand_over(self, run_id: str, decision: Decision) -> bool:
        """Execute a run that took ``run_id``'s slot (a higher priority, docs/how-to/queues.md)
        under a drive of its own; True if handed over.

        ``run_id`` stays pending and its wake was re-published: that wake must start a
        drive of ``run_id`` now, not coalesce into this one while it executes another
        run (the displaced run would then be decided only after that run settled, late
        and by whatever rule that later drive applies). Kept here when a drive of the
        other run is already under way in this process (it finds the run owned here).
        """
        activation = decision.activation
        if activation is None or activation.row.id == run_id:
            return False
        other = activation.row.id
        if other in self._active:
            return False
        self._active[other] = asyncio.create_task(
            self._execute(other, decision), name=f"drive:{other}"
        )
        self.changed.set()
        return True

    async def _execute(self, run_id: str, decision: Decision) -> None:
        """The drive of a run activated in another's place: execute it, then decide it
        again if a wake for it arrived meanwhile (as ``_run`` does)."""
        try:
            await self._driver.run_decided(decision)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("run.drive_failed", extra={"run_id": run_id})
        finally:
            self._active.pop(run_id, None)
            self.changed.set()
        if not self.closed and run_id in self._again:
            self._again.discard(run_id)
            self.drive(run_id)

    async def join(self, timeout: float | None = None) -> bool:
        """Wait for every active drive; True if all finished within ``timeout``."""
        tasks = list(self._active.values())
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        return not pending
