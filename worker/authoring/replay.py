"""One execution's replay bookkeeping: positions, records, durable retry, parks and clocks.

Every resume re-executes a flow body from the top. Each durable call takes the next
position (``next``); a call already recorded there returns its record without running, a
different call there is ``NonDeterminism``, and a record whose digest no longer matches
parks the run in ``quarantine``. A call that must wait parks the run (``park``:
``Suspended``) and the body resumes by replay when answered.

``Replay`` is the collaborator ``Context``'s parts are built with (``waits.Waits``,
``children.Children``, ``messages.Messages``, ``versions.Versions`` and ``Context.step``),
as Temporal's workflow context hands its instance to each API and River's executor holds
its job's state: one object owns the history and the fence, the parts only ask it. The
driver builds one per activation and stops it with ``interrupt``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import runfleet.worker.tracing as tracing
from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.errors import LimitExceeded
from runfleet.store.steps import StepRecord, StepWrite
from runfleet.store.types import (
    AlreadySatisfied,
    ClockExisting,
    ClockScheduled,
    GuardFailed,
    NotFound,
    NotOwner,
    Owner,
    Parked,
    ParkOutcome,
    RunRow,
    RunStatus,
    Waiting,
    WaitingReason,
)
from runfleet.worker.authoring.durable import Call, Cause, Interrupted, NonDeterminism, Suspended
from runfleet.worker.bookkeeping import Bookkeeping
from runfleet.worker.retry import durable_call, is_transient

log = logging.getLogger("runfleet.flow")
T = TypeVar("T")


class Replay:
    """The history and fence of one activation of a run (``run`` at ``epoch`` by ``owner``).

    Built alone (a test needs a row, an owner and an epoch; durable calls need a store).
    ``records`` is the history a resumed run replays (the driver loads it before the
    body starts); ``interrupt`` is how the driver stops the body (a cancel, a lost fence,
    a lapse, a shutdown).
    """

    def __init__(
        self,
        run: RunRow,
        owner: Owner,
        epoch: int,
        *,
        store: Store | None = None,
        settings: Settings | None = None,
        records: Mapping[int, StepRecord] | None = None,
        lease_ok: Callable[[], bool] | None = None,
        bookkeeping: Bookkeeping | None = None,
    ) -> None:
        self.run = run
        self.owner = owner
        self.epoch = epoch
        self._store = store
        self.settings = settings
        self.records: dict[int, StepRecord] = dict(records or {})
        self.lease_ok = lease_ok
        """The process's local lease gate (monotonic, no I/O): False once it may have lapsed."""
        self.bookkeeping = bookkeeping
        """The process's shared step batches; without one, each write is its own statement."""
        self.in_bookkeeping = 0
        """Nesting depth of runfleet's own store calls in progress: while above zero the body
        runs no user code, only I/O the database fences (the fail-stop watchdog ignores it)."""
        self.bookkeeping_error: BaseException | None = None
        """A transient error runfleet's own store call gave up on (the driver releases the
        run for it rather than failing it: the database failed, not the flow)."""
        self.wake_hint: float | None = None
        """Monotonic time a timer park is due: the driver asks for a wake then."""
        self._interrupt: Cause | None = None
        self._position = 0
        self._seen: Counter[str] = Counter()
        self._controls: list[BaseException] = []
        """The control exceptions runfleet raised into this execution (the newest few)."""

    def load(self, records: Iterable[StepRecord]) -> None:
        """The history a resumed activation replays (the driver reads it before the body)."""
        self.records = {record.position: record for record in records}

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("this Context has no store: durable calls need a worker")
        return self._store

    # ---- stopping the body ---------------------------------------------------

    @property
    def interrupted(self) -> Cause | None:
        return self._interrupt

    def interrupt(self, cause: Cause) -> None:
        """Stop this execution for ``cause``: its next durable call raises ``Interrupted``."""
        self._interrupt = cause

    def check(self) -> None:
        """Raise Interrupted if this drive must stop (sync bodies reach it at durable calls)."""
        if self._interrupt is not None:
            raise self.stop(self._interrupt)
        if self.lease_ok is not None and not self.lease_ok():
            # Checked before every durable call: a process whose lease may be stale by now
            # starts nothing more, even before its lapse timer has interrupted the run.
            self._interrupt = Cause.LEASE_LAPSED
            raise self.stop(Cause.LEASE_LAPSED)

    def _control(self, exc: BaseException) -> BaseException:
        """Remember ``exc`` as one runfleet raises into the body, and return it to raise."""
        self._controls = [*self._controls[-7:], exc]
        return exc

    def stop(self, cause: Cause) -> Interrupted:
        """The ``Interrupted`` runfleet raises to stop this execution."""
        exc = Interrupted(cause)
        self._control(exc)
        return exc

    def suspend(self, reason: str) -> Suspended:
        """The ``Suspended`` runfleet raises once the run parked durably."""
        exc = Suspended(reason)
        self._control(exc)
        return exc

    def raised_by_runfleet(self, exc: BaseException) -> bool:
        """Whether ``exc``, a BaseException out of the run's code, is runfleet's own stop.

        ``Interrupted`` and ``Suspended`` are runfleet's only as the instances it raised
        (a body that raises its own would leave the run unsettled, and re-run for ever);
        a ``CancelledError`` only once runfleet interrupted this execution (a cancel, a
        lost fence, a lapse, a shutdown). Every other BaseException — ``SystemExit``,
        ``KeyboardInterrupt``, ``GeneratorExit``, the user's own — is the run's.
        """
        if isinstance(exc, Interrupted | Suspended):
            return any(exc is mine for mine in self._controls)
        if isinstance(exc, asyncio.CancelledError):
            return self._interrupt is not None
        return False

    # ---- positions and records -----------------------------------------------

    async def durable(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A bookkeeping call, retried on transient errors while ``check`` lets the run go on.

        Never the user's ``Retry`` policy: that is for the user's function only.
        """
        self.in_bookkeeping += 1
        try:
            return await durable_call(what, call, check=self.check, run_id=self.run.id)
        except Exception as exc:
            if is_transient(exc):
                self.bookkeeping_error = exc
            raise
        finally:
            self.in_bookkeeping -= 1

    def peek(self) -> StepRecord | None:
        """The record at the next position, without taking it (``ctx.patched``)."""
        return self.records.get(self._position)

    async def next(self, kind: str, name: str) -> Call:
        """The next position's call: its key, and its record when one is there to replay."""
        self.check()
        self._seen[f"{kind}:{name}"] += 1
        key = f"{kind}:{name}#{self._seen[f'{kind}:{name}']}"
        position = self._position
        self._position += 1
        record = self.records.get(position)
        if record is None:
            self._within_limits(kind, position)
            return Call(position, key, None)
        if record.key != key:
            raise NonDeterminism(position, record.key, key)
        if not record.intact:
            await self._quarantine(record)
        return Call(position, key, record)

    def _within_limits(self, kind: str, position: int) -> None:
        """LimitExceeded (the run fails, never retried) past the per-run caps on durable
        calls and on children: a loop that records or spawns without end is a bug."""
        if self.settings is None:
            return
        cap = self.settings.max_steps_per_run
        if position >= cap:
            raise LimitExceeded("max_steps_per_run", cap, f"run {self.run.id!r} recorded {cap}")
        if kind in ("child", "spawn"):
            started = sum(n for k, n in self._seen.items() if k.startswith(("child:", "spawn:")))
            cap = self.settings.max_children_per_run
            if started > cap:
                raise LimitExceeded(
                    "max_children_per_run", cap, f"run {self.run.id!r} started {cap} children"
                )

    async def record(
        self,
        position: int,
        key: str,
        name: str,
        kind: str,
        output: Any,
        compensate: str | None = None,
        attempt: int | None = None,
    ) -> StepRecord:
        write = StepWrite(
            self.run.id, self.epoch, key, name, kind, position, output, compensate, attempt
        )
        record = await self.durable("steps.record", lambda: self._write_record(write))
        if record is None:
            record = await self._own_record(position, key)
        self.records[position] = record
        return record

    async def _write_record(self, write: StepWrite) -> StepRecord | None:
        if self.bookkeeping is not None:
            return await self.bookkeeping.record(write)
        return (await self.store.steps.record_many(self.owner, [write]))[0]

    async def start_attempt(self, key: str) -> int | None:
        """The attempt number of a step's next try at ``key``; None: the fence is lost."""
        if self.bookkeeping is not None:
            return await self.bookkeeping.start_attempt(self.run.id, self.epoch, key)
        return await self.store.steps.start_attempt(self.run.id, self.owner, self.epoch, key)

    async def _own_record(self, position: int, key: str) -> StepRecord:
        """The record this tenure already wrote at ``position``, else the fence is lost.

        A retried record whose first try committed but whose answer was lost finds its
        own row (``ON CONFLICT DO NOTHING`` returns none): same key, same epoch. Only the
        owner at an epoch can write a record with that epoch, so it is ours.
        """
        existing = await self.durable("steps.of_run", lambda: self.store.steps.of_run(self.run.id))
        for record in existing:
            if record.position == position and record.key == key and record.epoch == self.epoch:
                return record
        raise self.stop(Cause.LOST_FENCE)

    # ---- parks and clocks ----------------------------------------------------

    async def park(self, waiting: Waiting, deferred: str | None = None) -> None:
        """Park durably and stop the body, unless the answer is already there."""
        outcome = await self.durable(
            "waits.park",
            lambda: self.store.waits.park(
                self.run.id, self.owner, self.epoch, waiting, deferred=deferred
            ),
        )
        self._parked(outcome, waiting)

    def _parked(self, outcome: ParkOutcome, waiting: Waiting) -> None:
        """Stop the body as the park answered (Suspended), or let it go on if satisfied."""
        match outcome:
            case Parked():
                tracing.parked(waiting.reason, waiting.token, waiting.wake_at_ms)
                raise self.suspend(waiting.reason)
            case AlreadySatisfied():
                return
            case GuardFailed():
                raise self.stop(Cause.CANCELLED)
            case NotOwner(current=current) if self._parked_by_us(current, waiting):
                raise self.suspend(waiting.reason)  # a retry after its park committed unseen
            case NotOwner() | NotFound():
                raise self.stop(Cause.LOST_FENCE)

    def _parked_by_us(self, current: RunRow, waiting: Waiting) -> bool:
        """Suspended at this tenure's epoch for its reason: only this tenure's park does that."""
        return (
            current.status is RunStatus.SUSPENDED
            and current.epoch == self.epoch
            and current.waiting is not None
            and current.waiting.reason == waiting.reason
        )

    async def _quarantine(self, record: StepRecord) -> None:
        """A recorded output no longer matches its digest: park for an operator's decision."""
        problem = jr.Quarantined(
            key=record.key, problem="recorded output does not match its digest"
        )
        outcome = await self.durable(
            "waits.quarantine",
            lambda: self.store.waits.quarantine(self.run.id, self.owner, self.epoch, problem),
        )
        request = problem.dump()
        log.error("run.quarantined", extra={"run_id": self.run.id, **request})
        self._parked(
            outcome, Waiting(reason=WaitingReason.QUARANTINE, token=record.key, request=request)
        )

    async def now_ms(self) -> int:
        """The database's clock (every durable timer is on it, never this host's)."""
        return await self.durable("now_ms", self.store.stats.now_ms)

    async def deferred(self, name: str) -> Any:
        """The completion of this run's deferred ``name`` (an event, a child, a clock), or None."""
        return await self.durable(
            "waits.deferred", lambda: self.store.deferreds.deferred(self.run.id, name)
        )

    async def ensure_clock(self, name: str, due_at_ms: int) -> int:
        """Schedule the durable clock ``name`` (an existing one keeps its due time)."""
        outcome = await self.durable(
            "waits.schedule_clock",
            lambda: self.store.waits.schedule_clock(
                self.run.id, name, name, due_at_ms, self.owner, self.epoch
            ),
        )
        match outcome:
            case ClockScheduled(row=row) | ClockExisting(row=row):
                return row.due_at_ms
            case _:
                raise self.stop(Cause.LOST_FENCE)
