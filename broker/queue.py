"""Producers: ``Queue`` (synchronous, rq-shaped) and ``AsyncQueue`` over one admission path.

Admission is one Postgres round trip (run row + ``created`` record, one implicit
transaction: ``store.admit``), then one pipelined stream write; concurrent ``enqueue``
calls share both (``broker.batching``). The message is only a hint: if Redis fails after
the commit the run is still durable and the lost-wake sweep schedules it. So a single
``enqueue`` returns at the commit, its durable point, and its stream message follows in
the background (coalesced with the next ones; ``close`` sends what is left), where
``enqueue_many`` waits for its one pipeline. Every
Postgres call a producer makes retries transient errors (``store.transient``) for
``RUNFLEET_PRODUCER_RETRY_FOR`` seconds, then raises ``Unavailable`` naming the service.
``Queue`` runs the same ``AsyncQueue`` code on a private event-loop thread, so the two
differ only in how they are called. Every call that reads or changes a run first checks that
the producer's scopes cover the run's.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from redis.asyncio import Redis

from broker.admission import (
    EnqueueSpec,
    check_signature,
    dependency_ids,
    flow_target,
    importable,
    rq_options,
    split_rq_call,
    unknown,
)
from broker.batching import Coalesce, GroupCommit
from broker.client import connect
from broker.codec import message_for
from broker.notify import Notifier
from broker.streams import Lane, Streams, lane_for
from broker.trust import producer_run_id, producer_scopes
from store import Store, validate
from store.config import Settings
from store.errors import (
    CancelRequestFailed,
    InvalidInput,
    RunfleetError,
    RunNotFound,
    ScopeDenied,
    Unavailable,
)
from store.jobs import Jobs
from store.journal import Kind
from store.transient import is_transient, retrying, service_of
from store.types import (
    CancelOutcome,
    CancelRequested,
    CreateOutcome,
    DeferredCompleted,
    NewRun,
    RunRow,
    RunStatus,
)
from store.waits import token_hash

log = logging.getLogger("runfleet.broker.queue")
T = TypeVar("T")

__all__ = [
    "AsyncQueue",
    "AsyncRun",
    "EnqueueSpec",
    "Unavailable",
    "check_signature",
    "flow_target",
]


class RunFailed(RunfleetError):
    """The run settled ``failed``; ``error`` is what the worker recorded."""

    def __init__(self, run_id: str, error: Any) -> None:
        super().__init__(f"run {run_id!r} failed: {error}")
        self.run_id = run_id
        self.error = error


class RunCancelled(RunfleetError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled")
        self.run_id = run_id


class AsyncRun:
    """A handle on one run: id, status, result, cancel."""

    def __init__(self, queue: AsyncQueue, run_id: str) -> None:
        self._queue = queue
        self.id = run_id

    def __repr__(self) -> str:
        return f"AsyncRun({self.id!r})"

    async def fetch(self) -> RunRow:
        return await self._queue.authorized(self.id)

    async def get_status(self) -> RunStatus:
        return (await self.fetch()).status

    async def return_value(self) -> Any:
        """The result if the run completed, else None (rq's meaning; never waits)."""
        row = await self._last_round(await self.fetch())
        return row.result if row.status is RunStatus.COMPLETED else None

    async def result(self, timeout: float = 30.0) -> Any:
        """Wait until the run settles; its result, or RunFailed / RunCancelled / TimeoutError.

        Woken by the settled notification; polls Postgres as a fallback, so a lost
        notification (or no Redis at all) costs at most one poll interval. ``timeout``
        must be a finite number of seconds (``InvalidInput``: nan or inf never end).
        """
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise InvalidInput("timeout", f"must be a finite number of seconds >= 0: {timeout!r}")
        deadline = time.monotonic() + timeout
        row = await self._last_round(await self.fetch())
        if row.status.terminal:  # settled: one indexed read, no subscription
            return _outcome(row)
        async with self._queue.notifier.watch_settled(self.id) as watch:
            while True:  # read again once subscribed: a settle in between is not missed
                row = await self._last_round(await self.fetch())
                if row.status.terminal:
                    return _outcome(row)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"run {self.id!r} is still {row.status.value}")
                await watch.wait(min(remaining, 0.5))

    async def _last_round(self, row: RunRow) -> RunRow:
        """A run that handed off is answered by the last round of its lineage."""
        while row.status is RunStatus.COMPLETED and row.handed_off_to:
            successor = await self._queue.authorized(row.handed_off_to)
            row = successor
        return row

    async def cancel(self, *, actor: str | None = None) -> CancelOutcome:
        return await self._queue.cancel(self.id, actor=actor)


def _outcome(row: RunRow) -> Any:
    if row.status is RunStatus.COMPLETED:
        return row.result
    if row.status is RunStatus.CANCELLED:
        raise RunCancelled(row.id)
    raise RunFailed(row.id, row.error)


ADMIT_GROUP = 500
"""The most concurrent single enqueues one admission round trip carries."""


def _lane(front: bool) -> Lane:
    return Lane.RECOVERY if front else Lane.NORMAL


class AsyncQueue:
    """Admit runs to one queue from asyncio code."""

    def __init__(
        self,
        name: str = "default",
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        scopes: Iterable[str] = (),
        late_binding: bool = False,
    ) -> None:
        self.late_binding = late_binding
        overrides = {
            k: v for k, v in (("database_url", database_url), ("redis_url", redis_url)) if v
        }
        base = settings or Settings()
        self.settings = base.model_copy(update=overrides)
        self.name = name
        self.scopes = producer_scopes(scopes)
        self._store: Store | None = None
        self._redis: Redis | None = None
        # One batch per stream lane (rq's at_front runs go to the recovery lane).
        self._groups: dict[Lane, GroupCommit[NewRun, AsyncRun]] = {
            lane: GroupCommit(
                functools.partial(self._admit_each, lane=lane),
                max_items=ADMIT_GROUP,
                name=f"enqueue:{lane.value}",
            )
            for lane in Lane
        }
        self._hints: dict[Lane, Coalesce[RunRow]] = {
            lane: Coalesce(functools.partial(self._publish_ready, lane=lane), name="hints")
            for lane in Lane
        }

    async def connect(self) -> AsyncQueue:
        if self._store is None:
            try:
                budget = self.settings.producer_retry_for
                self._store = await Store.open(
                    self.settings, min_size=1, checkout_timeout=max(0.5, min(2.0, budget))
                )
            except Exception as exc:  # the pool waits up to 30 s for a first connection
                if is_transient(exc):
                    raise Unavailable(service_of(exc), exc) from exc
                raise
            self._redis = connect(self.settings)
            self.streams = Streams(self._redis, self.settings.redis_prefix)
            self.notifier = Notifier(self._redis, self.settings.redis_prefix)
        return self

    async def close(self) -> None:
        for group in self._groups.values():
            await group.drain()  # enqueues in flight finish on the store they began on
        for hints in self._hints.values():
            await hints.drain()  # their stream messages go out before Redis closes
        if self._store is not None:
            await self._store.close()
            self._store = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def __aenter__(self) -> AsyncQueue:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("queue is not connected: use `async with AsyncQueue(...)`")
        return self._store

    async def _available(
        self, call: Callable[[], Awaitable[T]], *, retried: list[BaseException] | None = None
    ) -> T:
        """``call`` with transient errors retried for the producer budget, then Unavailable.

        ``retried`` collects the errors retried past, for callers whose write is not
        idempotent on its own: a retry after a lost answer may find its own commit.
        """

        def on_retry(attempt: int, exc: BaseException) -> None:
            if retried is not None:
                retried.append(exc)
            log.warning(
                "producer.retry",
                extra={"attempt": attempt, "service": service_of(exc), "error": repr(exc)},
            )

        try:
            return await retrying(
                call, give_up_after=self.settings.producer_retry_for, on_retry=on_retry
            )
        except Exception as exc:
            if is_transient(exc):
                raise Unavailable(service_of(exc), exc) from exc
            raise

    # ---- admission -----------------------------------------------------------

    async def _new_run(self, spec: EnqueueSpec, delay_until_ms: int | None = None) -> NewRun:
        if spec.run_id is not None:
            producer_run_id(spec.run_id)  # never an id in the derived namespace
        name, _declared_queue, fn, takes_ctx = flow_target(spec.target)
        args, kwargs = list(spec.args), dict(spec.kwargs)
        check_signature(fn, takes_ctx, args, kwargs)
        if isinstance(spec.target, str) and not self.late_binding and not importable(name):
            if await self._available(lambda: self.store.flows.get(name)) is None:
                raise unknown(name)
        options = {k: v for k, v in spec.options.items() if k not in ("at_front", "depends_on")}
        extra, job_timeout = rq_options(**options)
        depends_on = dependency_ids(spec.options.get("depends_on"))
        if depends_on:
            if takes_ctx:
                raise InvalidInput("depends_on", "is for plain functions (a flow awaits ctx.child)")
            for dependency in depends_on:
                await self.authorized(dependency)  # exists, and this producer may see it
            extra["depends_on"] = depends_on
        timeout = job_timeout if job_timeout is not None else getattr(spec.target, "timeout", None)
        return NewRun(
            id=spec.run_id or uuid.uuid4().hex,
            flow=name,
            queue=self.name,  # as in rq, the queue enqueued on decides
            payload={"args": args, "kwargs": kwargs},
            scopes=self.scopes,
            delay_until_ms=delay_until_ms,
            timeout_ms=int(timeout * 1000) if isinstance(timeout, int | float) else None,
            max_rounds=getattr(spec.target, "max_rounds", None),
            extra=extra,
        )

    async def _admit(self, news: list[NewRun], lane: Lane) -> list[AsyncRun]:
        # Run ids are fixed before the first try: a retry joins what an unseen commit admitted.
        rows = await self._available(lambda: self.store.runs.create_many(news))
        await self._publish_ready([o.row for o in rows], lane=lane)
        return [AsyncRun(self, o.row.id) for o in rows]

    async def _admit_each(
        self, news: Sequence[NewRun], *, lane: Lane
    ) -> list[AsyncRun | Exception]:
        """One group-commit batch of single enqueues: each caller its own run or error.

        Run ids are fixed before the first try, so a retry joins what an unseen commit
        admitted. A batch the database refuses as a whole (a payload Postgres rejects, a
        privilege) is admitted run by run, so each caller learns its own outcome.
        """
        outcomes: list[CreateOutcome | Exception]
        try:
            outcomes = await self._available(lambda: self.store.runs.admit_each(news))
        except Unavailable:
            raise  # every caller of the batch would have waited out the same outage
        except Exception:
            if len(news) == 1:
                raise
            outcomes = [await self._admit_alone(new) for new in news]
        for outcome in outcomes:
            if not isinstance(outcome, Exception):
                self._hints[lane].add(outcome.row)
        return [o if isinstance(o, Exception) else AsyncRun(self, o.row.id) for o in outcomes]

    async def _admit_alone(self, new: NewRun) -> CreateOutcome | Exception:
        try:
            return (await self._available(lambda: self.store.runs.admit_each([new])))[0]
        except Exception as exc:
            return exc

    async def _publish_ready(self, rows: list[RunRow], *, lane: Lane) -> None:
        """One stream message per admitted run that may start now (a hint: never fails);
        rq's at_front runs go to the recovery lane, read before any backlog."""
        ready = [row for row in rows if row.status is RunStatus.PENDING and row.waiting is None]
        messages = [
            (row.queue, message_for(row.id, row.flow, "enqueue", "schedule")) for row in ready
        ]
        try:
            await self.streams.publish_many(messages, lane)
        except Exception as exc:
            log.warning("enqueue.publish_failed", extra={"runs": len(messages), "error": repr(exc)})

    async def enqueue(
        self,
        f: Any,
        *args: Any,
        run_id: str | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncRun:
        """Admit one run of ``f(*args, **kwargs)``; ``run_id`` (or rq's ``job_id``) dedupes.

        rq's option keywords (``job_timeout``, ``result_ttl``, ``failure_ttl``, ``retry``,
        ``on_success``, ``on_failure``, ``at_front``, ``meta``, ``description``) are
        options, not arguments, as in rq (README "Producers (rq-shaped)").
        """
        return await self._enqueue(f, args, kwargs, run_id or job_id, None)

    async def _enqueue(
        self,
        f: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None,
        delay_until_ms: int | None,
    ) -> AsyncRun:
        args, kwargs, options = split_rq_call(args, kwargs)
        spec = EnqueueSpec(f, args, kwargs, run_id, options)
        new = await self._new_run(spec, delay_until_ms)  # checked before it joins a batch
        return await self._groups[_lane(bool(options.get("at_front")))].submit(new)

    async def enqueue_call(
        self,
        func: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        **options: Any,
    ) -> AsyncRun:
        """rq's ``enqueue_call``: the function's arguments as a tuple and a dict."""
        return await self.enqueue(
            func, args=tuple(args or ()), kwargs=dict(kwargs or {}), job_id=job_id, **options
        )

    async def enqueue_at(
        self,
        when: datetime,
        f: Any,
        *args: Any,
        run_id: str | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncRun:
        """Admit a run that starts at ``when`` (rq's scheduled job; naive means UTC)."""
        if not isinstance(when, datetime):
            raise InvalidInput("when", f"must be a datetime, got {type(when).__name__}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        try:
            at_ms = int(when.timestamp() * 1000)
        except (OverflowError, ValueError, OSError) as exc:
            raise InvalidInput("when", f"is not a time runfleet can store: {exc}") from None
        return await self._enqueue(f, args, kwargs, run_id or job_id, at_ms)

    async def enqueue_in(
        self,
        delay: timedelta,
        f: Any,
        *args: Any,
        run_id: str | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncRun:
        if not isinstance(delay, timedelta):
            raise InvalidInput("delay", f"must be a timedelta, got {type(delay).__name__}")
        try:
            when = datetime.now(UTC) + delay
        except OverflowError:
            raise InvalidInput("delay", f"{delay} is outside the calendar") from None
        return await self.enqueue_at(when, f, *args, run_id=run_id or job_id, **kwargs)

    async def enqueue_many(self, specs: Sequence[EnqueueSpec]) -> list[AsyncRun]:
        """Admit a batch in one transaction and one pipeline: all or nothing."""
        front = any(spec.options.get("at_front") for spec in specs)
        return await self._admit([await self._new_run(spec) for spec in specs], _lane(front))

    @staticmethod
    def prepare_data(
        f: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        run_id: str | None = None,
        **options: Any,
    ) -> EnqueueSpec:
        """rq's ``Queue.prepare_data``; ``options`` are enqueue's rq options."""
        _, _, checked = split_rq_call((), dict(options))
        return EnqueueSpec(f, tuple(args), dict(kwargs or {}), run_id or job_id, checked)

    # ---- rq's queue and registry reads ----------------------------------------

    async def queued_ids(self, limit: int = 100_000) -> list[str]:
        """Runs waiting in this queue to be started (rq's ``job_ids``), oldest first."""
        jobs = Jobs(self.store)
        return await self._available(lambda: jobs.queued_ids(self.name, self.scopes, limit))

    async def failed_ids(self, limit: int = 100_000) -> list[str]:
        """Runs of this queue that failed and were not requeued (rq's failed registry)."""
        jobs = Jobs(self.store)
        return await self._available(lambda: jobs.failed_ids(self.name, self.scopes, limit))

    async def requeue(self, run_id: str, *, actor: str | None = None) -> AsyncRun:
        """Run a failed run again (rq's ``requeue``; ``runfleet retry RUN``).

        A failed run stays failed (terminal is never left): a new round of its
        lineage runs the same flow and arguments, and reading the old id answers
        with that round. Requeueing twice joins the same round.
        """
        row = await self.authorized(run_id)
        jobs = Jobs(self.store)
        again = await self._available(lambda: jobs.requeue(row.id, actor=actor))
        await self._publish_ready([again], lane=Lane.NORMAL)
        return AsyncRun(self, again.id)

    # ---- other producer calls ------------------------------------------------

    def run(self, run_id: str) -> AsyncRun:
        return AsyncRun(self, run_id)

    async def authorized(self, run_id: str) -> RunRow:
        """The run's row, if it exists and this producer's scopes cover the run's."""
        validate.identifier("run_id", run_id)
        row = await self._available(lambda: self.store.runs.get(run_id))
        if row is None:
            raise RunNotFound(run_id)
        missing = sorted(set(row.scopes) - set(self.scopes))
        if missing:
            raise ScopeDenied(run_id, missing)
        return row

    async def _hint(self, run_id: str, reason: str, row: RunRow | None = None) -> None:
        """Wake the run's queue after a committed change; never fails the producer call.

        ``row`` is the run as the caller already read it (queue, flow and epoch are what
        the wake needs), so the hint costs no read of its own; without one it reads.
        """
        try:
            if row is None:
                row = await self.store.runs.get(run_id)
            if row is None:
                return
            # A woken run already started: its wake takes the recovery lane, ahead of any backlog.
            await self.streams.publish(
                row.queue, message_for(row.id, row.flow, reason), lane_for(row.epoch)
            )
        except Exception as exc:  # the lost-wake sweep covers it
            log.warning("wake.publish_failed", extra={"run_id": run_id, "error": repr(exc)})

    async def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome:
        """Durably request cancellation of the logical run (every round of its lineage),
        then tell the owners by publish (a hint).

        A write that fails for the whole retry budget is CancelRequestFailed with
        ``retryable`` set (nothing was recorded: ask again), never a raw driver error.
        """
        await self.authorized(run_id)
        try:
            outcome = await self._available(
                lambda: self.store.lifecycle.request_cancel(run_id, note=actor)
            )
        except psycopg.errors.InsufficientPrivilege:
            raise  # the caller's role may not cancel this run: its error, not a failed write
        except (Unavailable, psycopg.Error) as exc:
            retryable = isinstance(exc, Unavailable) or is_transient(exc)
            raise CancelRequestFailed(
                run_id, "cancel_request_failed", repr(exc), retryable=retryable
            ) from exc
        targets, known = [run_id], {}
        if isinstance(outcome, CancelRequested):
            targets = list(dict.fromkeys([*outcome.rounds, *outcome.cascaded])) or [run_id]
            known = {outcome.row.id: outcome.row}  # as the request left it: no second read
        for target in targets:  # each closes through its own cancel path, promptly
            await self.notifier.publish_cancel(target)
            await self._hint(target, "cancel", known.get(target))
        return outcome

    async def interrupt_unsafe(self, run_id: str) -> None:
        """Refused: runfleet has one cancellation path, ``cancel``, durable and cascading.

        Forcing a run to stop without its compensations and without the cascade
        to its children would leave exactly the half-done state this system exists
        to prevent, so the call always fails with ``unsafe_interrupt_unsupported``.
        """
        raise CancelRequestFailed(
            run_id,
            "unsafe_interrupt_unsupported",
            "use cancel(): it is durable, runs compensations and cascades to attached children",
        )

    async def complete(
        self, run_id: str, name: str, value: Any = None, *, actor: str | None = None
    ) -> bool:
        """Complete the event ``name`` a run waits for (first writer wins); True if first.

        Only ``ctx.wait_for`` events: an approval, a child, a timer or a quota is
        ``NotAnswerable`` (nothing written). The journal names the database role that
        answered; ``actor`` is kept beside it as a note.
        """
        row = await self.authorized(run_id)  # a run waiting on an event has started
        done = await self._available(
            lambda: self.store.waits.answer_event(run_id, name, value, note=actor)
        )
        if done.woke:
            await self._hint(run_id, "event", row)
        return isinstance(done.outcome, DeferredCompleted)  # a settled run takes no answer

    async def approve(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self._answer(run_id, token, True, value, actor, reason)

    async def deny(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self._answer(run_id, token, False, value, actor, reason)

    async def _answer(
        self, run_id: str, token: str, approved: bool, value: Any, actor: str, reason: str | None
    ) -> None:
        row = await self.authorized(run_id)  # a run waiting for an approval has started
        retried: list[BaseException] = []
        done = await self._available(
            lambda: self.store.waits.answer_approval(
                run_id, token, approved=approved, value=value, actor=actor, reason=reason
            ),
            retried=retried,
        )
        if done is None and retried and await self._journaled(run_id, token, actor, approved):
            return  # our first try committed; its answer was lost with the connection
        if done is None:
            raise InvalidInput("token", f"run {run_id!r} is not waiting for an approval with it")
        if done.woke:
            await self._hint(run_id, "approval", row)

    async def resume(
        self,
        run_id: str,
        *,
        accept_recorded: bool = False,
        rerun_step: str | None = None,
        actor: str | None = None,
    ) -> None:
        """Move a quarantined run on: trust its recorded outputs, or re-run one step."""
        row = await self.authorized(run_id)  # a quarantined run has started
        retried: list[BaseException] = []
        resumed = await self._available(
            lambda: self.store.steps.resume_quarantined(
                run_id, accept_recorded=accept_recorded, rerun_key=rerun_step, note=actor
            ),
            retried=retried,
        )
        if not resumed and not (retried and await self._resumed(run_id, rerun_step, actor)):
            raise InvalidInput("run_id", f"run {run_id!r} is not quarantined")
        await self._hint(run_id, "resume", row)

    async def _last_record(self, run_id: str, *kinds: str) -> tuple[str, dict[str, Any]]:
        """Kind and payload of the run's newest journal record of one of ``kinds``."""
        records = await self._available(lambda: self.store.journal.records(run_id, limit=10_000))
        mine = [r for r in records if r.kind in kinds and isinstance(r.payload, dict)]
        return (mine[-1].kind, dict(mine[-1].payload)) if mine else ("", {})

    async def _journaled(self, run_id: str, token: str, actor: str, approved: bool) -> bool:
        """Whether the run's last decision is this one (a retried answer's own commit)."""
        kind, last = await self._last_record(run_id, Kind.APPROVAL_APPROVED, Kind.APPROVAL_DENIED)
        wanted = Kind.APPROVAL_APPROVED if approved else Kind.APPROVAL_DENIED
        mine = last.get("token") == token_hash(token) and last.get("note") == actor
        return kind == wanted and mine

    async def _resumed(self, run_id: str, rerun_step: str | None, actor: str | None) -> bool:
        """Whether the run's last resume is this one (a retried resume's own commit)."""
        kind, last = await self._last_record(run_id, Kind.RESUMED)
        return (
            kind == Kind.RESUMED
            and last.get("from") == "quarantine"
            and last.get("rerun_step") == rerun_step
            and last.get("note") == actor
        )
