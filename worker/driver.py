"""The run driver: decide (claim, steal or leave), execute, and settle exactly once.

One ``drive(run_id)`` reads the row and takes the one step its state allows:
a runnable row is claimed and activated; a running row whose lease is stale by
database time is probed and, if no witness vouches for its owner, stolen with the
evidence journaled; anything else is left alone. An activated run is executed and
settled with the cancel guard, so a run is never both cancelled and completed.
A run that leaves this process's fence (the heartbeat did not confirm it) is
interrupted and writes nothing more. A closed driver (the worker is stopping) claims
nothing, and a run whose claim was already in flight is handed back before its body starts.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, assert_never

import runfleet.worker.containment as containment
import runfleet.worker.metrics as metrics
import runfleet.worker.tracing as tracing
from runfleet.rqface.job_timeouts import timed
from runfleet.rqface.rq_api import DEFAULT_JOB_TIMEOUT
from runfleet.rqface.running import asking_retry, retrying_returned, running_job, wants_rq_call
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.journal_records import ReleaseCause
from runfleet.store.types import (
    GuardFailed,
    Owner,
    Parked,
    ParkOutcome,
    RowLocked,
    RunRow,
)
from runfleet.worker.authoring.context import Context
from runfleet.worker.authoring.durable import Cause, Interrupted, Suspended
from runfleet.worker.authoring.flows import Flow
from runfleet.worker.authoring.replay import Replay
from runfleet.worker.authoring.step_timeouts import ABANDONED
from runfleet.worker.authoring.sync_context import SyncContext
from runfleet.worker.bookkeeping import Bookkeeping
from runfleet.worker.containment import UserBaseException
from runfleet.worker.decisions import Decider
from runfleet.worker.evidence import RefusalLadder
from runfleet.worker.outcomes import Decision, DriveOutcome
from runfleet.worker.ports import Hints, LeaseView, Slots
from runfleet.worker.resolver import function
from runfleet.worker.retry import is_transient, until_row_free
from runfleet.worker.rq_compat import call_rq_style
from runfleet.worker.settle import Settlement
from runfleet.worker.takeover import ProbeFn, Takeover
from runfleet.worker.threads import in_thread
from runfleet.worker.wake_hints import WakeHints

log = logging.getLogger("runfleet.worker.driver")


@dataclass
class Execution:
    """A run this process owns right now, at one epoch."""

    ctx: Context
    task: asyncio.Task[Any] | None = None
    cause: Cause | None = field(default=None)


class Driver:
    """Decide, execute and settle runs, handed the rest of the process as named ports.

    Built alone (a test needs a store, an owner and settings); the worker process passes
    the liveness ``probe`` and its ports (``worker.ports``): ``hints`` (what it tells
    Redis: the outbox), ``lease`` (whether it may act for its runs: the lease gate) and
    ``slots`` (limited queues' freed slots and rate tokens). Left out: no Redis hints, a
    lease taken as held, nothing to pump.
    """

    def __init__(
        self,
        store: Store,
        owner: Owner,
        settings: Settings,
        *,
        probe: ProbeFn | None = None,
        hints: Hints | None = None,
        lease: LeaseView | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings
        self._lease = lease
        self._slots = slots
        self.owned: dict[str, Execution] = {}
        self.executing: set[str] = set()
        """Runs whose body may still run here (a task or its thread not yet ended)."""
        self.takeover = Takeover(store, owner, settings, probe)
        self.decider = Decider(
            store,
            owner,
            settings,
            self.takeover,
            owned=self.owned,
            hints=hints,
            lease=lease,
            slots=slots,
        )
        hint = hints.hint if hints is not None else None
        self._hint = hint
        """A run released here can move now (``Hints.hint``); also each ``Context``'s."""
        self.settlement = Settlement(
            store, owner, hint=hint, announce=hints.settled if hints is not None else None
        )
        self.bookkeeping = Bookkeeping(store, owner)
        self.wake_hints = WakeHints(hint)

    def close(self) -> None:
        """Claim nothing from now on (stream deliveries, batches, sweeps, steals, recoveries).

        Synchronous, so the worker calls it the moment its stop begins: no drive can
        claim between the stop and an event-loop turn. A claim already sent may still
        commit; ``_execute`` then hands that run back without starting its body.
        """
        self.decider.close()

    @property
    def closed(self) -> bool:
        """The worker is stopping: no claim by any path, no body starts (``close``)."""
        return self.decider.closed

    @property
    def ladder(self) -> RefusalLadder:
        """When a vouched-for owner's lease is probed again (``Takeover``)."""
        return self.takeover.ladder

    def running_user_code(self) -> int:
        """How many run bodies may be executing user code now (read by the watchdog thread).

        A body waiting on runfleet's own store call is not counted: a psycopg call on a
        silently cut link cannot be cancelled for a while, but whatever it sends is fenced
        by owner and epoch, so it cannot act after a takeover. Reads only atomic snapshots.
        A sync step thread abandoned at its timeout still runs user code: it counts too.
        """
        count = ABANDONED.count()
        for run_id in list(self.executing):
            execution = self.owned.get(run_id)
            if execution is not None and execution.ctx.in_bookkeeping == 0:
                count += 1
        return count

    # ---- decide ------------------------------------------------------------

    async def drive(self, run_id: str) -> DriveOutcome:
        """Decide the run from its row, then take the one step it allows (``run_decided``)."""
        return await self.run_decided(await self.decider.decide(run_id))

    async def drive_delivered(self, run_id: str, flow_name: str) -> DriveOutcome:
        """As ``drive`` for a stream message naming ``flow_name`` (``Decider.delivered``)."""
        return await self.run_decided(await self.decider.delivered(run_id, flow_name))

    async def run_decided(self, decision: Decision) -> DriveOutcome:
        """Count the decision and execute the run it activated; returns its outcome."""
        metrics.CLAIM_OUTCOMES.labels(decision.outcome).inc()
        if decision.activation is not None:
            await self._execute(decision.activation.row, decision.activation.flow)
        return decision.outcome

    # ---- execute -----------------------------------------------------------

    async def _execute(self, row: RunRow, flow: Flow | None) -> None:
        replay = Replay(
            row,
            self.owner,
            row.epoch,
            store=self.store,
            settings=self.settings,
            lease_ok=self._lease.open if self._lease is not None else None,
            bookkeeping=self.bookkeeping,
        )
        ctx = Context(replay, resolve_function=function, hint=self._hint)
        execution = Execution(ctx)
        self.owned[row.id] = execution
        metrics.RUNS_IN_FLIGHT.inc()
        deadline = self._deadline_timer(row)
        try:
            if self.closed:  # its claim was in flight when the worker began to stop
                self.interrupt(row.id, Cause.SHUTDOWN)
            elif row.cancel_requested_at_ms is not None or flow is None:
                await self.settlement.cancelled(row, row.epoch)
                return
            # A first activation has no predecessor that could have recorded, unless the
            # run was admitted with a copied history (store.forks: a resume or a fork).
            if (row.epoch > 1 or row.state.get("replays")) and execution.cause is None:
                replay.load(await self.store.steps.of_run(row.id))
            if execution.cause is not None or flow is None:
                # Interrupted between its activation and its body: the body never starts.
                await self._unstarted(row, execution.cause or Cause.SHUTDOWN)
                return
            self.settlement.began(row)  # run.started
            execution.task = tracing.start_task(  # an activation span when tracing is on
                self._call(flow, ctx), row, self.owner, name=f"run:{row.id}"
            )
            self.executing.add(row.id)
            execution.task.add_done_callback(lambda _task: self.executing.discard(row.id))
            await asyncio.wait({execution.task})
            await self._settle(row, flow, execution)
        except Exception:
            await self._cleanup_in_place(row, execution)
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            self.settlement.ended(row.id)
            self.owned.pop(row.id, None)
            metrics.RUNS_IN_FLIGHT.dec()
            if row.limited and self._slots is not None:
                self._slots.slot_freed(row.queue)  # settled, parked or released: its slot is free

    async def _unstarted(self, row: RunRow, cause: Cause) -> None:
        """Settle by ``cause`` a run interrupted between its activation and its body."""
        match cause:
            case Cause.LOST_FENCE:
                log.warning("run.fence_lost", extra={"run_id": row.id, "epoch": row.epoch})
            case Cause.CANCELLED:
                await self.settlement.cancelled(row, row.epoch)
            case Cause.SHUTDOWN | Cause.LEASE_LAPSED | Cause.DRIVE_FAILED | Cause.INFRA_UNAVAILABLE:
                await self.release(row, cause)
            case _:
                assert_never(cause)

    async def _cleanup_in_place(self, row: RunRow, execution: Execution) -> None:
        """A drive that fails while it may still hold the fence hands the run back now.

        Otherwise the activated row stays owned by this live process, which no longer
        renews it, and every other worker's probe vouches for it: only its own
        ``self-orphaned`` steal would move it, after ``stale_after``. One try, fenced (a
        settlement that did commit makes it a no-op); if the store is down too, the
        steal stays the backstop and the drive's own error is what gets logged.
        """
        if execution.cause == Cause.LOST_FENCE:
            return
        if execution.task is not None and not execution.task.done():
            return  # the body still runs: its settlement decides
        try:  # unguarded: a cancel asked meanwhile is closed by the cancel sweep elsewhere
            released = await self._park_released(row, Cause.DRIVE_FAILED, guard=False)
        except Exception:
            return
        # No wake hint: the released sweep paces a retry if the store is sick.
        if isinstance(released, Parked):
            metrics.RELEASES.labels(Cause.DRIVE_FAILED).inc()
            log.info("run.released", extra={"run_id": row.id, "cause": Cause.DRIVE_FAILED})

    def _deadline_timer(self, row: RunRow) -> asyncio.TimerHandle | None:
        """Cancel the run through the ordinary path when its deadline passes mid-execution."""
        deadline_ms = row.deadline_ms
        if deadline_ms is None:
            return None
        delay = max(0.0, (deadline_ms - row.now_ms) / 1000)
        loop = asyncio.get_running_loop()
        return loop.call_later(delay, lambda: asyncio.ensure_future(self._deadline(row.id)))

    async def _deadline(self, run_id: str) -> None:
        try:
            await self.store.lifecycle.request_cancel(run_id, note="deadline", reason="deadline")
        except Exception:  # the deadline sweep tries again
            log.exception("run.deadline_cancel_failed", extra={"run_id": run_id})
            return
        self.interrupt(run_id, Cause.CANCELLED)

    async def _call(self, flow: Flow, ctx: Context) -> Any:
        """Run the body; a BaseException of its own becomes ``UserBaseException``.

        This is the run task's whole coroutine, so nothing the body raises reaches the
        event loop (``SystemExit`` would end the process) or reads as a cancellation of
        the task (a shutdown, to ``_settle``) unless runfleet itself stopped it. The
        ``GeneratorExit`` of this coroutine being closed (a pending task collected at
        shutdown) goes back to ``close()`` as Python requires: it is no code's failure.
        """
        token = containment.running(ctx.run.id)
        task = asyncio.current_task()
        assert task is not None
        containment.watch(ctx.run.id, task)
        try:
            return await self._body(flow, ctx)
        except BaseException as exc:
            escaped = containment.escaped(ctx.run.id)  # a loop callback of its own exited
            if escaped is not None:
                raise UserBaseException(escaped) from escaped
            if isinstance(exc, Exception) or not ctx.raised_by_user(exc):
                raise
            raise UserBaseException(exc) from exc
        finally:
            containment.unwatch(ctx.run.id)
            containment.done_running(token)

    async def _body(self, flow: Flow, ctx: Context) -> Any:
        if wants_rq_call(flow, ctx):  # rq's retry= / on_success= / on_failure=
            return await call_rq_style(flow, ctx)
        args, kwargs = ctx.args, ctx.kwargs
        if flow.is_async and flow.takes_context:
            return await flow.fn(ctx, *args, **kwargs)
        if flow.is_async:  # a plain coroutine function: rq's get_current_job() answers
            call_async = asking_retry(timed(flow.fn, DEFAULT_JOB_TIMEOUT))
            with running_job(flow, ctx):
                return await retrying_returned(ctx, lambda: call_async(*args, **kwargs))
        if not flow.takes_context:  # a plain function: rq's get_current_job() answers
            call = asking_retry(timed(flow.fn, DEFAULT_JOB_TIMEOUT))
            with running_job(flow, ctx):
                return await retrying_returned(ctx, lambda: in_thread(call, *args, **kwargs))
        return await in_thread(
            flow.fn, SyncContext(ctx, asyncio.get_running_loop()), *args, **kwargs
        )

    def interrupt(self, run_id: str, cause: Cause) -> bool:
        """Stop executing a run (cancel request, lost fence, lapse, shutdown)."""
        execution = self.owned.get(run_id)
        if execution is None or (execution.task is not None and execution.task.done()):
            return False  # not ours, or its body already ended and its settlement decides
        # A lost fence outranks everything: once another owner holds the run, this
        # process must not write, not even a cancellation or a release.
        if execution.cause is None or cause == Cause.LOST_FENCE:
            execution.cause = cause
            execution.ctx.replay.interrupt(cause)
        if execution.task is not None and not execution.task.done():
            execution.task.cancel(msg=cause)
        return True

    # ---- settle ------------------------------------------------------------

    async def _settle(self, row: RunRow, flow: Flow, execution: Execution) -> None:
        task = execution.task
        assert task is not None
        epoch = execution.ctx.epoch
        exc = None if task.cancelled() else task.exception()
        cause = execution.cause
        if cause is None and isinstance(exc, Interrupted):
            cause = exc.cause
        if cause is None and task.cancelled():
            cause = Cause.SHUTDOWN
        if isinstance(exc, Suspended) and cause in (None, Cause.LOST_FENCE):
            log.debug("run.parked", extra={"run_id": row.id, "reason": str(exc)})
            if cause is None:
                self.wake_hints.arm(row, execution.ctx.wake_hint)
            return
        match cause:
            case Cause.LOST_FENCE:
                log.warning("run.fence_lost", extra={"run_id": row.id, "epoch": epoch})
            case Cause.CANCELLED:
                await self.settlement.cancelled(row, epoch)
            case Cause.SHUTDOWN | Cause.LEASE_LAPSED | Cause.DRIVE_FAILED | Cause.INFRA_UNAVAILABLE:
                await self.release(row, cause)
            case None if exc is None:
                await self.settlement.result(row, epoch, task.result(), flow.max_rounds)
            case None if execution.ctx.bookkeeping_error is not None and is_transient(exc):
                await self.release(row, Cause.INFRA_UNAVAILABLE)  # the store failed, not the flow
            case None:
                await self.settlement.failed(row, epoch, exc)
            case _:
                assert_never(cause)

    async def _park_released(
        self, row: RunRow, cause: Cause, *, guard: bool = True
    ) -> ParkOutcome | RowLocked:
        lapsed = cause is Cause.LEASE_LAPSED
        return await self.store.waits.release(
            row.id,
            self.owner,
            row.epoch,
            cause=ReleaseCause.LEASE_LAPSED if lapsed else ReleaseCause.INTERRUPTED,
            detail=cause,
            guard=guard,
            unconfirmed_ms=(
                self._lease.unconfirmed_ms() if lapsed and self._lease is not None else None
            ),
        )

    async def release(self, row: RunRow, cause: Cause) -> bool:
        """Hand an unsettled run back (shutdown, lapse): park ``released``, journaled.

        Compensations do not run: shutdown is not cancellation. But the row decides, not
        the cause in memory: a cancel committed and not yet delivered when the body was
        interrupted refuses the release (``waits.release``'s guard, fenced by owner and
        epoch), and the run is cancelled here, compensations first, as the cancel path
        does. Returns False when the run was not released: the fence was already gone
        (another owner took the run meanwhile), or it was cancelled instead.
        """
        outcome = await until_row_free("release", row.id, lambda: self._park_released(row, cause))
        if isinstance(outcome, GuardFailed):  # still ours at this epoch, and cancel was asked
            log.info("run.cancel_found_at_release", extra={"run_id": row.id, "cause": cause})
            await self.settlement.cancelled(row, row.epoch, found_at=cause)
            return False
        if not isinstance(outcome, Parked):
            return False
        metrics.RELEASES.labels(cause).inc()
        log.info("run.released", extra={"run_id": row.id, "cause": cause})
        if self._hint is not None:
            await self._hint(row)
        return True
