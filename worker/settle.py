"""How an activated run ends in this process: completed, failed, cancelled, handed off.

Every ending is one owner-fenced transaction that the journal records; a lost
fence means another owner holds the run and this process writes nothing more.
Cancellation first runs the compensations of completed steps, newest first,
each marked done durably so a crash mid-way never repeats one.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, assert_never

import runfleet.worker.metrics as metrics
from runfleet.declaration import flow_target
from runfleet.runtime.batching import GroupCommit
from runfleet.store import Store, rounds, settlements, validate
from runfleet.store import journal_records as jr
from runfleet.store.errors import RunfleetError, UnknownFlow
from runfleet.store.types import (
    CheckedSettle,
    GuardFailed,
    NotFound,
    NotOwner,
    Owner,
    RowLocked,
    RunError,
    RunRow,
    RunStatus,
    Settle,
    Transitioned,
    TransitionOutcome,
)
from runfleet.store.values import UnstorableValue
from runfleet.worker.authoring.durable import Handoff, HandoffCall, checked_handoff
from runfleet.worker.containment import UserBaseException, safe_str
from runfleet.worker.resolver import function as compensation
from runfleet.worker.resolver import resolve
from runfleet.worker.retry import until_row_free, with_retry
from runfleet.worker.wake_hints import HintFn

log = logging.getLogger("runfleet.worker.settle")
AnnounceFn = Callable[[str, RunStatus], Awaitable[None]]


def _storable(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as something Postgres stores: NUL and lone surrogates escaped, bounded.

    An error message is data the flow chose (``ValueError("\\x00")``, a 2 MB repr): if
    it could not be stored, the failure itself could never be recorded.
    """
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if keep_end else text[:limit] + "…"


def error_of(exc: BaseException) -> RunError:
    """A failure as the run's ``error``: always storable, whatever the exception holds.

    A ``UserBaseException`` is recorded as the BaseException the run's code raised (its
    type, message and traceback), marked ``base_exception``: that is what failed the run.
    """
    contained = isinstance(exc, UserBaseException)
    if isinstance(exc, UserBaseException):
        exc = exc.original
    message = safe_str(exc)  # a hostile __str__ must not stop the run from failing
    if contained:
        message = f"{type(exc).__name__} raised by the run's own code" + (
            f": {message}" if message else ""
        )
    try:
        trace = "".join(traceback.format_exception(exc))
    except RecursionError:
        trace = "<traceback too deep to format>"
    except BaseException:  # a hostile __str__ again, inside the formatting
        trace = f"<traceback of {type(exc).__name__} could not be formatted>"
    return RunError(
        type=type(exc).__name__,
        module=_storable(type(exc).__module__, 200),
        message=_storable(message, 8000),
        traceback=_storable(trace, 4000, keep_end=True),
        base_exception=contained,
    )


class Settlement:
    def __init__(
        self,
        store: Store,
        owner: Owner,
        *,
        hint: HintFn | None,
        announce: AnnounceFn | None,
        group_commit: bool = True,
    ) -> None:
        self._store = store
        self._owner = owner
        self._hint = hint
        self._announce = announce
        self._batch: GroupCommit[CheckedSettle, TransitionOutcome | RowLocked] | None = (
            GroupCommit(self._settle_many, name="settle", isolate=(UnstorableValue,))
            if group_commit
            else None
        )
        self._began: dict[str, float] = {}
        """When each run executing here started (``began``): its ending line's ``ms``."""

    def began(self, row: RunRow) -> None:
        """A run's body starts in this process: log ``run.started`` (one line per
        activation; a resume after a wait or a takeover logs it again)."""
        self._began[row.id] = time.monotonic()
        if log.isEnabledFor(logging.INFO):
            log.info(
                "run.started",
                extra={"run_id": row.id, "flow": row.flow, "queue": row.queue, "epoch": row.epoch},
            )

    def ended(self, run_id: str) -> None:
        """The run's execution here is over (settled, parked, released or lost)."""
        self._began.pop(run_id, None)

    async def result(self, row: RunRow, epoch: int, result: Any, max_rounds: int | None) -> None:
        """Settle a body's return value: a result, or a handoff.

        Fails closed: a result that cannot be stored (not JSON, over the payload
        limit, a NUL, a lone surrogate, too deep; see ``store.values``) fails the run
        once with ``UnstorableValue``. It is a fact about the value, not an outage:
        retrying it, or letting the drive fail so the run is taken back and its body
        re-run, would fail the same way forever.
        """
        if isinstance(result, Handoff):
            await self.hand_off(row, epoch, result, max_rounds)
            return
        await self.finish(row, settlements.completed(row.id, epoch, result))

    async def failed(self, row: RunRow, epoch: int, exc: BaseException) -> None:
        """Settle a body that raised ``exc``: failed, with its error (``error_of``)."""
        await self.finish(row, settlements.failed(row.id, epoch, error_of(exc)))

    async def finish(self, row: RunRow, item: Settle) -> None:
        """Commit ``item`` (one ``store.settlements`` ending) and act on its outcome."""
        epoch, status = item.epoch, item.status
        error = RunError.from_json(item.patch.get("error")) if status is RunStatus.FAILED else None
        try:
            outcome = await self._transition(item)
        except UnstorableValue as exc:
            # Nothing was written. Fail the run instead, once: the same value would fail
            # the same way on every retry and on every takeover.
            log.error(
                "run.unstorable",
                extra={"run_id": row.id, "field": exc.field, "problem": exc.problem},
            )
            failure = error
            status = RunStatus.FAILED
            outcome = await self._fail_unstorable(row, epoch, exc, failure)
            error = error or error_of(exc)
        await self._after(row, epoch, status, outcome, error)

    async def _transition(self, item: Settle) -> TransitionOutcome:
        batch = self._batch
        if batch is None:
            return await self._alone(item)
        checked = self._store.lifecycle.check(item)  # an unstorable value fails this run alone
        outcome = await with_retry("settle", lambda: batch.submit(checked))
        if not isinstance(outcome, RowLocked):
            return outcome
        # Its row was locked elsewhere (its producer may hold it) and the batch went on
        # without it: settled alone, this run waits for its own row, and nothing else does.
        log.info("run.settle_alone_locked", extra={"run_id": item.run_id})
        return await self._alone(item)

    async def _alone(self, item: Settle) -> TransitionOutcome:
        """Settle ``item`` by itself. Its statement waits on the run's row at most
        ``worker_lock_wait_ms``: while another transaction holds it, the run is set aside
        and tried again (``until_row_free``), holding no connection meanwhile."""
        return await until_row_free(
            "settle", item.run_id, lambda: self._store.lifecycle.settle(self._owner, item)
        )

    async def _settle_many(
        self, items: Sequence[CheckedSettle]
    ) -> list[TransitionOutcome | RowLocked]:
        """Commit the settlements ready together as one transaction (``GroupCommit``: an
        item whose data Postgres refuses fails alone; an outage reaches every caller,
        whose retry submits again)."""
        return await self._store.lifecycle.settle_many(self._owner, items)

    async def _fail_unstorable(
        self, row: RunRow, epoch: int, exc: UnstorableValue, failure: RunError | None
    ) -> TransitionOutcome:
        """Fail the run, with the error shrunk until it fits the payload limit.

        ``failure`` is the error the run was failing with, if it was (a huge message or
        traceback): it is kept, shortened, in preference to the storage error.
        """
        errors: list[RunError] = []
        if failure is not None:
            kept = RunError(type=failure.type, message=failure.message)
            errors += [kept, replace(kept, message=str(kept.message)[:300])]
        unstorable = error_of(exc)
        errors += [unstorable, replace(unstorable, traceback=""), RunError(type=unstorable.type)]
        for error in errors[:-1]:
            try:
                return await self._transition(settlements.failed(row.id, epoch, error))
            except UnstorableValue:
                continue
        return await self._transition(settlements.failed(row.id, epoch, errors[-1]))

    async def _after(
        self,
        row: RunRow,
        epoch: int,
        status: RunStatus,
        outcome: TransitionOutcome,
        error: RunError | None = None,
    ) -> None:
        match outcome:
            case Transitioned():
                metrics.SETTLEMENTS.labels(status.value).inc()
                await self._settled(row, status, outcome, error)
            case GuardFailed():
                await self.cancelled(row, epoch)
            case NotOwner() | NotFound():
                log.warning("run.fence_lost", extra={"run_id": row.id, "epoch": epoch})

    async def _settled(
        self, row: RunRow, status: RunStatus, moved: Transitioned, error: RunError | None = None
    ) -> None:
        """Log and announce a settlement; hint the parents it woke (of every round of this
        lineage) and the descendants it asked to cancel, so each closes through its own
        cancel path now rather than at the next sweep. A parent it did not wake is not
        hinted: it is running (and reads the deferred when it waits) or still waits on
        others."""
        self._log_settled(row, status, error)
        if self._announce is not None:
            await self._announce(row.id, status)
        if self._hint is None:
            return
        for parent in moved.woke:  # as the waking statement left them: nothing to re-read
            await self._hint(parent)
        if not moved.cascaded:
            return
        for other in await self._store.runs.get_many(list(moved.cascaded)):
            if not other.status.terminal:
                await self._hint(other)

    def _log_settled(self, row: RunRow, status: RunStatus, error: RunError | None) -> None:
        """One line per settlement: ``run.completed`` / ``run.cancelled`` (info) with the
        milliseconds since its body started here, ``run.failed`` (warning) with the error's
        ``Type: message`` and its traceback, so a failing job leaves its trace in the
        worker's own output."""
        began = self._began.pop(row.id, None)
        level = logging.WARNING if status is RunStatus.FAILED else logging.INFO
        if not log.isEnabledFor(level):
            return
        fields: dict[str, Any] = {"run_id": row.id, "flow": row.flow}
        if began is not None:
            fields["ms"] = round((time.monotonic() - began) * 1000)
        if status is RunStatus.FAILED:
            failure = error or RunError()
            fields["error"] = str(failure)
            if failure.traceback:
                fields["traceback"] = failure.traceback
        match status:
            case RunStatus.COMPLETED:
                log.info("run.completed", extra=fields)
            case RunStatus.FAILED:
                log.warning("run.failed", extra=fields)
            case RunStatus.CANCELLED:
                log.info("run.cancelled", extra=fields)
            case RunStatus.PENDING | RunStatus.RUNNING | RunStatus.SUSPENDED:
                pass  # not a settlement
            case _:
                assert_never(status)

    async def cancelled(self, row: RunRow, epoch: int, *, found_at: str | None = None) -> None:
        """Close a run cancelled: compensations of completed steps in reverse, then the CAS.

        ``found_at``: the interrupt (shutdown, lapse) whose release found the cancel request
        instead of delivering it; journaled with the cancellation."""
        await self._compensate(row, epoch)
        item = settlements.cancelled(row.id, epoch, self._owner, found_at=found_at)
        outcome = await self._alone(item)
        match outcome:
            case Transitioned():
                metrics.SETTLEMENTS.labels(RunStatus.CANCELLED.value).inc()
                await self._settled(row, RunStatus.CANCELLED, outcome)
            case _:
                log.warning("run.fence_lost", extra={"run_id": row.id, "epoch": epoch})

    async def _compensate(self, row: RunRow, epoch: int) -> None:
        records = await self._store.steps.of_run(row.id)
        for record in sorted(records, key=lambda r: r.position, reverse=True):
            if record.compensate is None or record.compensated_at_ms is not None:
                continue
            try:
                # Only registered code runs (worker.resolver.function: --flows modules and
                # --allow-import prefixes), and only on the output its digest vouches for.
                target = compensation(record.compensate)
                if not record.intact:
                    raise RunfleetError("recorded output does not match its digest")
                if inspect.iscoroutinefunction(target):
                    await target(record.output)
                else:
                    await asyncio.to_thread(target, record.output)
            except BaseException as exc:  # a failed compensation is journaled, the rest run
                if _stopping(exc):
                    raise  # this drive itself is being cancelled (a hard stop), not the code
                log.exception(
                    "step.compensation_failed", extra={"run_id": row.id, "step": record.key}
                )
                await self._store.journal.emit_owned(
                    row.id,
                    self._owner,
                    epoch,
                    jr.StepCompensationFailed(key=record.key, error=str(error_of(exc).message)),
                )
                continue
            if not await self._store.steps.mark_compensated(row.id, self._owner, epoch, record.key):
                return  # fence lost: the new owner compensates what is left

    async def hand_off(
        self, row: RunRow, epoch: int, handoff: Handoff, max_rounds: int | None
    ) -> None:
        """Settle this round and admit the next in one transaction (both or neither).

        The budget is the lineage's: the one its first round recorded (and every round
        copies), so a later flow declaring a larger ``max_rounds`` cannot reset it; the
        running flow's own declaration counts only when the lineage recorded none. The
        next round gets its own deadline: the handoff's explicit one, or the target
        flow's ``timeout`` from now (database time), else none.
        """
        limit = row.max_rounds if row.max_rounds is not None else max_rounds
        next_round = row.round_ordinal + 1
        if limit is not None and next_round >= int(limit):
            await self.finish(row, settlements.lineage_exhausted(row.id, epoch, limit))
            return
        try:
            target = flow_target(handoff.flow)
            name, queue = target.name, target.queue
            call = checked_handoff(handoff)  # InvalidHandoff names a malformed field
            target.check(call.args, call.kwargs)
        except RunfleetError as exc:  # an unknown flow, a malformed handoff, or arguments
            # the next flow does not take: permanent, so the round fails once
            successor_id = rounds.round_id(row.lineage_id, next_round)
            await self.finish(
                row, settlements.round_invalid(row.id, epoch, error_of(exc), successor_id)
            )
            return
        deadline_ms, timeout_ms = _successor_deadline(call, name)
        successor = rounds.next_round(
            row,
            next_round,
            flow=name,
            queue=queue or row.queue,
            payload={"args": call.args, "kwargs": call.kwargs},
            max_rounds=limit,
            in_family=True,
            deadline_ms=deadline_ms,
            timeout_ms=timeout_ms,
        )

        try:
            done = await with_retry(
                "settle",
                lambda: self._store.lifecycle.hand_off(row.id, self._owner, epoch, successor),
            )
        except RunfleetError as exc:
            # The successor cannot be admitted (its id is taken by a different run):
            # nothing of the handoff was written, so the round fails instead.
            await self.finish(
                row, settlements.round_invalid(row.id, epoch, error_of(exc), successor.id)
            )
            return
        await self._after(row, epoch, RunStatus.COMPLETED, done.outcome)
        if done.successor is not None and self._hint is not None:
            await self._hint(done.successor)


def _stopping(exc: BaseException) -> bool:
    """Whether ``exc`` out of a compensation is a cancellation of the drive running it.

    A compensation is the run's own code: its ``SystemExit``, ``KeyboardInterrupt`` or a
    ``CancelledError`` nobody asked for fails that compensation only (journaled), and
    never reaches the event loop. A cancellation of the settling task is runfleet's.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _successor_deadline(call: HandoffCall, flow_name: str) -> tuple[int | None, int | None]:
    """(deadline_ms, timeout_ms) of the next round: explicit, else the target's timeout."""
    if call.deadline_ms is not None:
        return call.deadline_ms, None
    try:
        timeout = resolve(flow_name).timeout
    except UnknownFlow:  # a leg this process does not run: the round keeps no deadline
        return None, None
    return None, (validate.timeout_ms(timeout) if timeout is not None else None)
