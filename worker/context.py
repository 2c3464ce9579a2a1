"""What a flow body sees: its run, and the durable calls that make it resumable.

Every resume re-executes the body from the top. Each durable call takes the
next position; a call already recorded at that position returns its recorded
value without running, a different call there is NonDeterminism, and a record
whose digest no longer matches parks the run in ``quarantine``. A call that must
wait parks the run (``Suspended``) and the body resumes by replay when answered.

The replay bookkeeping and ``step`` are here; timers and waits are in
``worker.waits`` and child runs in ``worker.children``, mixins ``Context`` inherits.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from runfleet.store import Store
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
from runfleet.worker import tracing
from runfleet.worker.bookkeeping import Bookkeeping
from runfleet.worker.children import Children
from runfleet.worker.containment import safe_str
from runfleet.worker.durable import (
    NO_RETRY,
    Call,
    NonDeterminism,
    Retry,
    Suspended,
    reference,
)
from runfleet.worker.flows import function as resolve_function
from runfleet.worker.messages import Messages
from runfleet.worker.outcomes import Cause
from runfleet.worker.retry import durable_call, is_transient
from runfleet.worker.step_timeouts import call_with_timeout, checked_timeout
from runfleet.worker.threads import in_thread
from runfleet.worker.versions import Versions
from runfleet.worker.waits import Waits
from runfleet.worker.wake_hints import HintFn

log = logging.getLogger("runfleet.flow")
T = TypeVar("T")


class Interrupted(BaseException):
    """Raised into a flow whose run this process must stop executing.

    ``cause`` (``worker.outcomes.Cause``) is ``cancelled`` (commit ``cancelled``),
    ``lost-fence`` (another owner holds the run: write nothing), or one that releases
    the run so another worker resumes it (``lease-lapsed``, ``shutdown``...).
    """

    def __init__(self, cause: Cause) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass
class Context(Waits, Children, Messages, Versions):
    run: RunRow
    owner: Owner
    epoch: int
    store: Store | None = None
    settings: Settings | None = None
    hint: HintFn | None = None
    records: dict[int, StepRecord] = field(default_factory=dict)
    lease_ok: Callable[[], bool] | None = None
    """The process's local lease gate (monotonic, no I/O): False once the lease may have lapsed."""
    bookkeeping: Bookkeeping | None = None
    """The process's shared step batches; without one, each write is its own statement."""
    in_bookkeeping: int = field(default=0, init=False)
    """Nesting depth of runfleet's own store calls in progress: while above zero the body
    runs no user code, only I/O the database fences (the fail-stop watchdog ignores it)."""
    log: logging.LoggerAdapter[logging.Logger] = field(init=False)
    wake_hint: float | None = field(default=None, init=False)
    """Monotonic time a timer park is due: the driver asks for a wake then (sweeps back it up)."""
    _interrupt: Cause | None = field(default=None, init=False)
    bookkeeping_error: BaseException | None = field(default=None, init=False)
    """A transient error runfleet's own store call gave up on (the driver releases the
    run for it rather than failing it: the database failed, not the flow)."""
    _position: int = field(default=0, init=False)
    _seen: Counter[str] = field(default_factory=Counter, init=False)
    _controls: list[BaseException] = field(default_factory=list, init=False)
    """The control exceptions runfleet raised into this execution (the newest few)."""

    def __post_init__(self) -> None:
        self.log = logging.LoggerAdapter(log, {"run_id": self.run.id, "flow": self.run.flow})

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def args(self) -> list[Any]:
        return list((self.run.payload or {}).get("args") or [])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict((self.run.payload or {}).get("kwargs") or {})

    @property
    def interrupted(self) -> Cause | None:
        return self._interrupt

    def check(self) -> None:
        """Raise Interrupted if this drive must stop (sync bodies reach it at durable calls)."""
        if self._interrupt is not None:
            raise self._stop(self._interrupt)
        if self.lease_ok is not None and not self.lease_ok():
            # Checked before every durable call: a process whose lease may be stale by now
            # starts nothing more, even before its lapse timer has interrupted the run.
            self._interrupt = Cause.LEASE_LAPSED
            raise self._stop(Cause.LEASE_LAPSED)

    # ---- control exceptions: runfleet's own, and the body's --------------------------

    def _control(self, exc: BaseException) -> BaseException:
        """Remember ``exc`` as one runfleet raises into the body, and return it to raise."""
        self._controls = [*self._controls[-7:], exc]
        return exc

    def _stop(self, cause: Cause) -> Interrupted:
        """The ``Interrupted`` runfleet raises to stop this execution."""
        exc = Interrupted(cause)
        self._control(exc)
        return exc

    def _suspend(self, reason: str) -> Suspended:
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

    def raised_by_user(self, exc: BaseException) -> bool:
        """A BaseException that is not an ``Exception`` and not runfleet's own stop."""
        return not isinstance(exc, Exception) and not self.raised_by_runfleet(exc)

    # ---- replay bookkeeping ------------------------------------------------

    @property
    def _store(self) -> Store:
        if self.store is None:
            raise RuntimeError("this Context has no store: durable calls need a worker")
        return self.store

    async def _durable(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
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

    async def _next(self, kind: str, name: str) -> Call:
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

    async def _record(
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
        record = await self._durable("steps.record", lambda: self._write_record(write))
        if record is None:
            record = await self._own_record(position, key)
        self.records[position] = record
        return record

    async def _write_record(self, write: StepWrite) -> StepRecord | None:
        if self.bookkeeping is not None:
            return await self.bookkeeping.record(write)
        return (await self._store.steps.record_many(self.owner, [write]))[0]

    async def _start_attempt(self, key: str) -> int | None:
        if self.bookkeeping is not None:
            return await self.bookkeeping.start_attempt(self.run.id, self.epoch, key)
        return await self._store.steps.start_attempt(self.run.id, self.owner, self.epoch, key)

    async def _own_record(self, position: int, key: str) -> StepRecord:
        """The record this tenure already wrote at ``position``, else the fence is lost.

        A retried record whose first try committed but whose answer was lost finds its
        own row (``ON CONFLICT DO NOTHING`` returns none): same key, same epoch. Only the
        owner at an epoch can write a record with that epoch, so it is ours.
        """
        existing = await self._durable(
            "steps.of_run", lambda: self._store.steps.of_run(self.run.id)
        )
        for record in existing:
            if record.position == position and record.key == key and record.epoch == self.epoch:
                return record
        raise self._stop(Cause.LOST_FENCE)

    async def _park(self, waiting: Waiting, deferred: str | None = None) -> None:
        """Park durably and stop the body, unless the answer is already there."""
        outcome = await self._durable(
            "waits.park",
            lambda: self._store.waits.park(
                self.run.id, self.owner, self.epoch, waiting, deferred=deferred
            ),
        )
        self._parked(outcome, waiting)

    def _parked(self, outcome: ParkOutcome, waiting: Waiting) -> None:
        """Stop the body as the park answered (Suspended), or let it go on if satisfied."""
        match outcome:
            case Parked():
                tracing.parked(waiting.reason, waiting.token, waiting.wake_at_ms)
                raise self._suspend(waiting.reason)
            case AlreadySatisfied():
                return
            case GuardFailed():
                raise self._stop(Cause.CANCELLED)
            case NotOwner(current=current) if self._parked_by_us(current, waiting):
                raise self._suspend(waiting.reason)  # a retry after our park committed unseen
            case NotOwner() | NotFound():
                raise self._stop(Cause.LOST_FENCE)

    def _parked_by_us(self, current: RunRow, waiting: Waiting) -> bool:
        """Suspended at our epoch for our reason: only this tenure's park does that."""
        return (
            current.status is RunStatus.SUSPENDED
            and current.epoch == self.epoch
            and current.waiting is not None
            and current.waiting.reason == waiting.reason
        )

    async def _quarantine(self, record: StepRecord) -> None:
        """A recorded output no longer matches its digest: park for an operator's decision."""
        problem = {"key": record.key, "problem": "recorded output does not match its digest"}
        outcome = await self._durable(
            "waits.quarantine",
            lambda: self._store.waits.quarantine(
                self.run.id, self.owner, self.epoch, record.key, problem
            ),
        )
        log.error("run.quarantined", extra={"run_id": self.run.id, **problem})
        self._parked(
            outcome, Waiting(reason=WaitingReason.QUARANTINE, token=record.key, request=problem)
        )

    async def _now_ms(self) -> int:
        return await self._durable("now_ms", self._store.stats.now_ms)

    async def _deferred(self, name: str) -> Any:
        return await self._durable(
            "waits.deferred", lambda: self._store.waits.deferred(self.run.id, name)
        )

    # ---- steps -------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | None = None,
        compensate: Callable[..., Any] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn`` once for this run and record its output; replays return the record.

        ``timeout`` (seconds) bounds each attempt: ``StepTimeout`` past it, retried under
        ``retry`` like any failure (``worker.step_timeouts``)."""
        limit = checked_timeout(timeout) if timeout is not None else None
        call = await self._next("step", name)
        position, key, record = call.position, call.key, call.record
        if record is not None:
            return record.output
        policy = retry or NO_RETRY
        undo = reference(compensate) if compensate is not None else None
        if undo is not None:
            resolve_function(undo)  # UnknownFlow now, not a failed compensation at cancel
        steps = self._store.steps
        with tracing.step_span(name, key):
            while True:
                attempt = await self._durable(
                    "steps.start_attempt", lambda: self._start_attempt(key)
                )
                if attempt is None:
                    raise self._stop(Cause.LOST_FENCE)
                try:
                    with tracing.attempt_span(key, attempt):
                        if limit is not None:
                            output = await call_with_timeout(
                                fn, args, kwargs, timeout=limit, run_id=self.run.id, key=key
                            )
                        elif inspect.iscoroutinefunction(fn):
                            output = await fn(*args, **kwargs)
                        else:
                            output = await in_thread(fn, *args, **kwargs)
                except BaseException as exc:
                    if not isinstance(exc, Exception) and not self.raised_by_user(exc):
                        raise  # runfleet's own stop: the attempt is still in flight
                    error = safe_str(exc, use_repr=True)[:2000]
                    finish = partial(steps.finish_attempt, self.run.id, key, attempt, error)
                    await self._durable("steps.finish_attempt", finish)
                    # A BaseException of the step's own is never retried: it fails the run
                    # (the driver's boundary records it), unless the body catches it.
                    if not isinstance(exc, Exception) or not policy.should_retry(exc, attempt):
                        raise
                    delay = policy.delay(attempt)
                    log.info(
                        "step.retry",
                        extra={
                            "run_id": self.run.id,
                            "step": key,
                            "attempt": attempt,
                            "delay_s": round(delay, 3),
                        },
                    )
                    await self._backoff(key, attempt, delay)
                    continue
                await self._record(
                    position, key, name, "step", output, compensate=undo, attempt=attempt
                )
                return output

    async def _backoff(self, key: str, attempt: int, delay: float) -> None:
        """Wait before a retry: in-process if short, else park on a durable timer."""
        assert self.settings is not None
        if delay <= self.settings.park_backoff_over:
            await asyncio.sleep(delay)
            return
        clock = f"{key}:retry{attempt}"
        due = await self._ensure_clock(clock, await self._now_ms() + int(delay * 1000))
        await self._park(Waiting(reason=WaitingReason.TIMER, wake_at_ms=due), deferred=clock)

    async def _ensure_clock(self, name: str, due_at_ms: int) -> int:
        outcome = await self._durable(
            "waits.schedule_clock",
            lambda: self._store.waits.schedule_clock(
                self.run.id, name, name, due_at_ms, self.owner, self.epoch
            ),
        )
        match outcome:
            case ClockScheduled(row=row) | ClockExisting(row=row):
                return row.due_at_ms
            case _:
                raise self._stop(Cause.LOST_FENCE)
