"""Producers: ``Queue`` (synchronous, rq-shaped) and ``AsyncQueue`` over one admission path.

Admission is one Postgres round trip (run row + ``created`` record, one implicit
transaction: ``store.admit``), then one pipelined stream write; concurrent ``enqueue``
calls share both (``runtime.batching``). The message is only a hint: if Redis fails after
the commit the run is still durable and the lost-wake sweep schedules it. Every Postgres
call a producer makes retries transient errors (``store.transient``) for
``RUNFLEET_PRODUCER_RETRY_FOR`` seconds, then raises ``Unavailable`` naming the service.
``Queue`` runs the same ``AsyncQueue`` code on a private event-loop thread, so the two
differ only in how they are called. Every call that reads or changes a run first checks that
the producer's scopes cover the run's.

This module holds admission (``enqueue`` and its rq-shaped variants) and the queue's
registry reads; the calls on an existing run are collaborators built with the producer's
session (``producer.session``): ``RunControl`` (``producer.control``), ``RunMessages``
(``producer.messages``) and ``RunHistory`` (``producer.history``), which ``AsyncQueue``
delegates to; the run handle is ``AsyncRun`` (``producer.run``).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from redis.asyncio import Redis

from runfleet.broker.blocking import UnansweredXadds
from runfleet.broker.client import connect
from runfleet.broker.notify import Notifier, SettledMark
from runfleet.broker.streams import Lane, Streams
from runfleet.declaration import flow_target
from runfleet.producer.admission import (
    QUEUE_OPTIONS,
    EnqueueSpec,
    call_arguments,
    dependencies,
    importable,
    on_duplicate,
    rq_dotted,
    rq_options,
    split_rq_call,
    unknown,
)
from runfleet.producer.control import RunControl
from runfleet.producer.history import RunHistory
from runfleet.producer.job_ids import DuplicateJobError, rq_job_id
from runfleet.producer.messages import RunMessages
from runfleet.producer.run import AsyncRun
from runfleet.producer.session import ProducerSession
from runfleet.producer.trust import producer_run_id
from runfleet.runtime.batching import GroupCommit, ThreadGroupCommit
from runfleet.runtime.trace_context import current_carrier
from runfleet.store import Store, inline, validate
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, Unavailable
from runfleet.store.events import EventRow, SendOutcome
from runfleet.store.forks import Deleted
from runfleet.store.jobs import Jobs
from runfleet.store.queues import QueueSettings
from runfleet.store.reach import producer_pool_name
from runfleet.store.registries import Registries
from runfleet.store.steps import StepEntry
from runfleet.store.transient import is_transient
from runfleet.store.types import (
    AdmissionOptions,
    CancelOutcome,
    Created,
    CreateOutcome,
    EventAnswer,
    NewRun,
    RunRow,
    RunStatus,
    WaitingReason,
)
from runfleet.store.urls import resolve

__all__ = [
    "AsyncQueue",
    "AsyncRun",
    "EnqueueSpec",
    "Unavailable",
]


ADMIT_GROUP = 500
"""The most concurrent single enqueues one admission round trip carries."""


def _chosen_id(run_id: str | None, job_id: object) -> str | None:
    """``run_id`` (runfleet's rule), else rq's ``job_id`` checked by rq's rule."""
    if run_id is not None:
        return run_id
    return None if job_id is None else rq_job_id(job_id)


def _lane(front: bool) -> Lane:
    return Lane.RECOVERY if front else Lane.NORMAL


class AsyncQueue:
    """Admit runs to one queue from asyncio code.

    Admission is this class's own; the calls on an existing run are its collaborators'
    (``control``, ``messages``, ``history``), each built with the queue's ``session``
    (``producer.session.ProducerSession``: connections, scopes, the retry budget), and the
    queue delegates to them so that its surface stays rq's.
    """

    def __init__(
        self,
        name: str = "default",
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        scopes: Iterable[str] = (),
        late_binding: bool = False,
        default_timeout: Any = None,
    ) -> None:
        self.late_binding = late_binding
        self.default_timeout = default_timeout
        """rq's ``Queue(default_timeout=)``: the ``job_timeout`` of this queue's plain
        functions enqueued without one (None: ``DEFAULT_JOB_TIMEOUT``, 180 s)."""
        overrides = {
            k: v for k, v in (("database_url", database_url), ("redis_url", redis_url)) if v
        }
        # No URL anywhere: the embedded pair, or NoServers naming both ways out.
        base = resolve((settings or Settings()).model_copy(update=overrides))
        self.name = name
        self.session = ProducerSession(base, scopes)
        self.control = RunControl(self.session)
        self.messages = RunMessages(self.session)
        self.history = RunHistory(self.session, self.run)
        self._group_commit = True
        self._thread_groups: dict[Lane, ThreadGroupCommit[NewRun, AsyncRun]] = {}
        # One batch per stream lane (rq's at_front runs go to the recovery lane).
        self._groups: dict[Lane, GroupCommit[NewRun, AsyncRun]] = {
            lane: GroupCommit(
                functools.partial(self._admit_each, lane=lane),
                max_items=ADMIT_GROUP,
                name=f"enqueue:{lane.value}",
            )
            for lane in Lane
        }

    @property
    def settings(self) -> Settings:
        return self.session.settings

    @property
    def scopes(self) -> tuple[str, ...]:
        return self.session.scopes

    async def connect(self) -> AsyncQueue:
        if not self.session.connected:
            try:
                budget = self.settings.producer_retry_for
                pool_name = producer_pool_name()
                started = time.monotonic()
                store = await Store.open(
                    self.settings,
                    min_size=1,
                    checkout_timeout=max(0.5, min(2.0, budget)),
                    pool_name=pool_name,
                    open_timeout=max(1.0, budget),
                )
            except Exception as exc:  # the pool waits up to 30 s for a first connection
                if is_transient(exc):
                    waited = time.monotonic() - started
                    raise self.session.unavailable(exc, waited, pool_name) from None
                raise
            self._attach(store=store, redis=connect(self.settings))
        return self

    def _attach(
        self,
        *,
        store: Store,
        redis: Redis,
        group_commit: bool = True,
        unanswered: UnansweredXadds | None = None,
    ) -> None:
        """Use ``store`` and ``redis``. Without ``group_commit`` (``rqface.sync``'s blocking
        face, driven in its callers' threads) an enqueue never waits for a batch to form:
        a lone thread's goes out at once, and threads that enqueue while it is in flight
        share the next statement (``ThreadGroupCommit``);
        with ``unanswered`` its wake is sent without waiting for Redis's reply."""
        self.session.attach(store=store, redis=redis, unanswered=unanswered)
        self._group_commit = group_commit
        self._thread_groups = (
            {}
            if group_commit
            else {
                lane: ThreadGroupCommit(
                    functools.partial(self._admit_driven, lane=lane),
                    max_items=ADMIT_GROUP,
                    name=f"enqueue:{lane.value}",
                )
                for lane in Lane
            }
        )

    def _admit_driven(self, news: Sequence[NewRun], *, lane: Lane) -> list[AsyncRun | Exception]:
        """``_admit_each`` driven in the calling thread (the blocking face's batch)."""
        return inline.drive(self._admit_each(news, lane=lane))

    async def close(self) -> None:
        for group in self._groups.values():
            await group.drain()  # enqueues in flight finish on the store they began on
        await self.session.drain_reads()
        store, redis = self.session.detach()
        if store is not None:
            await store.close()
        if redis is not None:
            await redis.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def store(self) -> Store:
        return self.session.store

    @property
    def streams(self) -> Streams:
        return self.session.streams

    @property
    def notifier(self) -> Notifier:
        return self.session.notifier

    # ---- admission -----------------------------------------------------------

    async def _new_run(
        self, spec: EnqueueSpec, delay_until_ms: int | None = None, *, inline: bool = False
    ) -> NewRun:
        """``inline``: rq's ``is_async=False``, run in this process (any function will do)."""
        if spec.run_id is not None:
            producer_run_id(spec.run_id)  # never an id in the derived namespace
        target = flow_target(spec.target, elsewhere=not inline)
        name, fn, takes_ctx = target.name, target.fn, target.takes_context
        args, kwargs = list(spec.args), dict(spec.kwargs)
        target.check(args, kwargs)
        if isinstance(spec.target, str) and not importable(name):
            dotted = rq_dotted(name)  # rq's 'module.func' spelling, when no flow has the name
            if not self.late_binding or dotted is not None:
                given = name
                if await self.session.available(lambda: self.store.flows.get(given)) is None:
                    # late binding keeps a dotted name as a flow name (flow names hold dots):
                    # it is rq's module.func only where the producer can import that
                    if dotted is not None and importable(dotted):
                        name = dotted
                    elif not self.late_binding:
                        raise unknown(name)
        options = {
            k: v
            for k, v in spec.options.items()
            if k not in ("at_front", "depends_on", "unique", *QUEUE_OPTIONS)
        }
        plain = fn is not None and not takes_ctx
        if plain and self.default_timeout is not None:
            if options.get("job_timeout") is None and options.get("timeout") is None:
                options["job_timeout"] = self.default_timeout
        if spec.options.get("unique"):
            if spec.run_id is None:
                raise InvalidInput("unique", "needs job_id= (rq's rule)")
            chosen = spec.run_id
            if await self.session.available(lambda: self.store.runs.get(chosen)) is not None:
                raise DuplicateJobError(f"Job with ID '{chosen}' already exists")
        wanted = dependencies(spec.options.get("depends_on"))
        depends_on, allow_failure = wanted.ids, wanted.allow_failure
        rq = rq_options(**options, allow_failure=allow_failure)
        kept, job_timeout_ms = rq.options, rq.timeout_ms
        if spec.options.get("at_front"):
            kept = replace(kept, at_front=True)  # rq's job_ids order: at_front runs first
        if depends_on:
            if takes_ctx:
                raise InvalidInput("depends_on", "is for plain functions (a flow awaits ctx.child)")
            for dependency in depends_on:
                await self.session.authorized(dependency)  # exists, and this producer may see it
            kept = replace(kept, dependency_ids=tuple(depends_on))
            registries = Registries(self.store)
            gate = await self.session.available(
                lambda: registries.dependencies_met(depends_on, allow_failure)
            )
            if not gate.met:  # rq enqueues a job whose dependencies are met at once
                kept = replace(kept, depends_on=tuple(depends_on))
        if fn is not None and not takes_ctx:
            # A plain function's job_timeout is rq's: execution time, enforced by the worker
            # around the call (rqface/job_timeouts.py), failing it with JobTimeoutException.
            job_timeout_ms = None
        ttl = kept.ttl
        if ttl is not None:  # rq's ttl: a deadline from admission (docs/how-to/moving-from-rq.md)
            job_timeout_ms = min(job_timeout_ms or ttl * 1000, ttl * 1000)
        # the producer's current span becomes the run's parent
        trace = current_carrier() if self.settings.otel else None
        admitted = AdmissionOptions(
            rq=kept,
            flow_version=target.version,  # a versioned @flow's code
            flow_instance=target.admitted_instance(self.scopes),  # a class-bound @flow's
            trace=trace,
        )
        if job_timeout_ms is None and target.timeout is not None:  # a @flow's, in seconds
            job_timeout_ms = validate.timeout_ms(target.timeout)
        return NewRun(
            id=spec.run_id or uuid.uuid4().hex,
            flow=name,
            queue=self.name,  # as in rq, the queue enqueued on decides
            payload={"args": args, "kwargs": kwargs},
            scopes=self.scopes,
            delay_until_ms=delay_until_ms,
            timeout_ms=job_timeout_ms,
            max_rounds=target.max_rounds,
            options=admitted,
            # docs/how-to/queues.md: the call's priority, else the @flow's, else the queue's
            priority=spec.options.get("priority", target.priority),
            dedup_key=spec.options.get("dedup_key"),
            on_duplicate=on_duplicate(spec.options.get("on_duplicate", "join")),
        )

    async def _admit(self, news: list[NewRun], lane: Lane) -> list[AsyncRun]:
        # Run ids are fixed before the first try: a retry joins what an unseen commit admitted.
        mark = self.notifier.settled_mark()  # before the commit (``SettledMark``)
        rows = await self.session.available(lambda: self.store.admission.create_many(news))
        await self.session.publish_ready([o.row for o in rows], lane=lane)
        return [self._handle(o, mark) for o in rows]

    def _handle(self, admitted: CreateOutcome, mark: SettledMark | None) -> AsyncRun:
        created = isinstance(admitted, Created)
        return AsyncRun(self, admitted.row.id, created=created, settled_mark=mark)

    async def _admit_each(
        self, news: Sequence[NewRun], *, lane: Lane
    ) -> list[AsyncRun | Exception]:
        """One group-commit batch of single enqueues: each caller its own run or error.

        Run ids are fixed before the first try, so a retry joins what an unseen commit
        admitted. A batch the database refuses as a whole (a payload Postgres rejects, a
        privilege) is admitted run by run, so each caller learns its own outcome.
        """
        outcomes: list[CreateOutcome | Exception]
        mark = self.notifier.settled_mark()  # before the commit (``SettledMark``)
        try:
            outcomes = await self.session.available(lambda: self.store.admission.admit_each(news))
        except Unavailable:
            raise  # every caller of the batch would have waited out the same outage
        except Exception:
            if len(news) == 1:
                raise
            outcomes = [await self._admit_alone(new) for new in news]
        rows = [o.row for o in outcomes if not isinstance(o, Exception)]
        await self.session.publish_ready(rows, lane=lane)
        return [o if isinstance(o, Exception) else self._handle(o, mark) for o in outcomes]

    async def _admit_alone(self, new: NewRun) -> CreateOutcome | Exception:
        try:
            return (await self.session.available(lambda: self.store.admission.admit_each([new])))[0]
        except Exception as exc:
            return exc

    async def enqueue(
        self,
        f: Any,
        /,
        *args: Any,
        run_id: str | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncRun:
        """Admit one run of ``f(*args, **kwargs)``; ``run_id`` (or rq's ``job_id``) dedupes.

        rq's option keywords (``job_timeout``, ``result_ttl``, ``failure_ttl``, ``retry``,
        ``on_success``, ``on_failure``, ``at_front``, ``meta``, ``description``) are
        options, not arguments, as in rq (docs/how-to/moving-from-rq.md).
        """
        return await self._enqueue(f, args, kwargs, _chosen_id(run_id, job_id), None)

    async def _enqueue(
        self,
        f: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None,
        delay_until_ms: int | None,
    ) -> AsyncRun:
        call = split_rq_call(args, kwargs)
        options = call.options
        spec = EnqueueSpec(f, call.args, call.kwargs, run_id, options)
        new = await self._new_run(spec, delay_until_ms)  # checked before it joins a batch
        lane = _lane(bool(options.get("at_front")))
        if not self._group_commit:
            # The blocking face: threads sharing this queue follow one leading thread's
            # batch (the caller's thread is blocked here, this coroutine being driven).
            return self._thread_groups[lane].submit(new)
        return await self._groups[lane].submit(new)

    async def enqueue_call(
        self,
        func: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        **options: Any,
    ) -> AsyncRun:
        """rq's ``enqueue_call``: the function's arguments as a tuple and a dict
        (``timeout=`` is rq's older name of ``job_timeout=`` here)."""
        if "timeout" in options:
            options.setdefault("job_timeout", options.pop("timeout"))
        args, kwargs = call_arguments(args, kwargs)
        return await self.enqueue(func, args=args, kwargs=kwargs, job_id=job_id, **options)

    async def enqueue_at(
        self,
        when: datetime,
        f: Any,
        /,
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
        return await self._enqueue(f, args, kwargs, _chosen_id(run_id, job_id), at_ms)

    async def enqueue_in(
        self,
        delay: timedelta,
        f: Any,
        /,
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
        return await self.enqueue_at(when, f, *args, run_id=_chosen_id(run_id, job_id), **kwargs)

    async def enqueue_many(self, specs: Sequence[EnqueueSpec]) -> list[AsyncRun]:
        """Admit a batch in one transaction and one pipeline: all or nothing."""
        front = any(spec.options.get("at_front") for spec in specs)
        return await self._admit([await self._new_run(spec) for spec in specs], _lane(front))

    @staticmethod
    def prepare_data(
        f: Any = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        job_id: str | None = None,
        run_id: str | None = None,
        **options: Any,
    ) -> EnqueueSpec:
        """rq's ``Queue.prepare_data``; ``options`` are enqueue's rq options (``func=`` is
        rq's name of ``f``)."""
        if f is None:
            f = options.pop("func", None)
        if f is None:
            raise InvalidInput("func", "prepare_data needs the function to enqueue")
        checked = split_rq_call((), dict(options)).options
        call_args, call_kwargs = call_arguments(args, kwargs)
        return EnqueueSpec(f, call_args, call_kwargs, _chosen_id(run_id, job_id), checked)

    # ---- rq's queue and registry reads ----------------------------------------

    async def queued_ids(self, limit: int = 100_000) -> list[str]:
        """Runs waiting in this queue to be started (rq's ``job_ids``), oldest first."""
        registries = Registries(self.store)
        return await self.session.available(
            lambda: registries.queued(self.name, self.scopes, limit)
        )

    async def failed_ids(self, limit: int = 100_000) -> list[str]:
        """Runs of this queue that failed and were not requeued (rq's failed registry)."""
        jobs = Jobs(self.store)
        return await self.session.available(lambda: jobs.failed_ids(self.name, self.scopes, limit))

    async def requeue(self, run_id: str, *, actor: str | None = None) -> AsyncRun:
        """Run a failed run again (rq's ``requeue``; ``runfleet retry RUN``).

        A failed run stays failed (terminal is never left): a new round of its
        lineage runs the same flow and arguments, and reading the old id answers
        with that round. Requeueing twice joins the same round.
        """
        row = await self.session.authorized(run_id)
        jobs = Jobs(self.store)
        again = await self.session.available(lambda: jobs.requeue(row.id, actor=actor))
        await self.session.publish_ready([again], lane=Lane.NORMAL)
        return AsyncRun(self, again.id)

    # ---- other producer calls ------------------------------------------------

    def run(self, run_id: str) -> AsyncRun:
        return AsyncRun(self, run_id)

    # ---- the calls on an existing run: the collaborators' -------------------------

    async def authorized(self, run_id: str) -> RunRow:
        """The run's row, if it exists and this producer's scopes cover the run's."""
        return await self.session.authorized(run_id)

    async def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome:
        """``producer.control.RunControl.cancel``: durable, lineage-wide, then a hint."""
        return await self.control.cancel(run_id, actor=actor)

    async def interrupt_unsafe(self, run_id: str) -> None:
        """Refused: ``producer.control.RunControl.interrupt_unsafe``."""
        await self.control.interrupt_unsafe(run_id)

    async def complete(
        self, run_id: str, name: str, value: Any = None, *, actor: str | None = None
    ) -> EventAnswer:
        """``producer.control.RunControl.complete``: answer the event ``name``."""
        return await self.control.complete(run_id, name, value, actor=actor)

    async def approve(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self.control.approve(run_id, token, value, actor=actor, reason=reason)

    async def deny(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self.control.deny(run_id, token, value, actor=actor, reason=reason)

    async def resume(
        self,
        run_id: str,
        *,
        accept_recorded: bool = False,
        rerun_step: str | None = None,
        actor: str | None = None,
    ) -> None:
        """``producer.control.RunControl.resume``: move a quarantined or dead run on."""
        await self.control.resume(
            run_id, accept_recorded=accept_recorded, rerun_step=rerun_step, actor=actor
        )

    async def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        """``producer.messages.RunMessages.get_event``: the run's event ``key``, or None."""
        return await self.messages.get_event(run_id, key, timeout)

    async def get_events(self, run_id: str) -> dict[str, Any]:
        """``producer.messages.RunMessages.get_events``: every event of the run, by key."""
        return await self.messages.get_events(run_id)

    async def get_event_row(self, run_id: str, key: str, timeout: float = 0.0) -> EventRow | None:
        return await self.messages.get_event_row(run_id, key, timeout)

    async def send(
        self, run_id: str, topic: str, value: Any = None, *, message_id: str | None = None
    ) -> SendOutcome:
        """``producer.messages.RunMessages.send``: to the run's ``ctx.recv(topic)``."""
        return await self.messages.send(run_id, topic, value, message_id=message_id)

    async def configure(
        self,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        default_priority: int | None = None,
        note: str | None = None,
    ) -> QueueSettings:
        """Set this queue's fleet-wide limits from Python (``runfleet queue set`` does the
        same): ``concurrency`` runs at once, ``rate`` starts per second (a token bucket),
        ``default_priority``; 0 lifts a limit, None leaves a setting as it is. Journaled
        with the authenticated role (``store.queues.Queues.set``); the next claim of every
        worker obeys it. Needs a role that may write the queue settings (the operator's)."""
        name = self.name
        settings: QueueSettings = await self.session.available(
            lambda: self.store.queues.set(
                name,
                concurrency=concurrency,
                rate_per_s=rate,
                default_priority=default_priority,
                note=note,
            )
        )
        return settings

    async def list_steps(self, run_id: str) -> list[StepEntry]:
        """The run's steps (DBOS ``list_workflow_steps``): every recorded call, and every
        step attempted and never recorded (``failed`` with its last error, or
        ``unfinished``), each with its attempt count (``store.steps.Steps.listing``)."""
        await self.authorized(run_id)
        listed: list[StepEntry] = await self.session.available(
            lambda: self.store.steps.listing(run_id)
        )
        return listed

    async def resume_run(self, run_id: str, *, actor: str | None = None) -> AsyncRun:
        """Resume the run under the id the caller holds (DBOS ``resume_workflow``).

        A failed or cancelled run continues in a new round replaying its recorded calls
        (``producer.history.RunHistory.resume_run``); the id keeps answering for it (status,
        result, events, messages follow the round). A run parked dead moves on in place
        (``resume``). A run that is open or completed has nothing to resume: the handle
        is returned and nothing changes, so resuming twice is harmless. A quarantined run
        needs a choice (``resume(accept_recorded=|rerun_step=)``): refused with the reason.
        """
        row = await self.session.answering(run_id)
        if row.waiting is not None and row.waiting.reason in (
            WaitingReason.DEAD,
            WaitingReason.QUARANTINE,
        ):
            await self.control.resume(row.id, actor=actor)
            return self.run(run_id)
        if row.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            await self.history.resume_run(run_id, actor=actor)
        return self.run(run_id)

    async def fork(
        self,
        run_id: str,
        from_step: int,
        *,
        new_run_id: str | None = None,
        actor: str | None = None,
    ) -> AsyncRun:
        """``producer.history.RunHistory.fork``: replay the first ``from_step`` calls."""
        return await self.history.fork(run_id, from_step, new_run_id=new_run_id, actor=actor)

    async def delete_run(self, run_id: str, *, actor: str | None = None) -> Deleted:
        """``producer.history.RunHistory.delete_run``: a settled run and all that is theirs.
        An id never used (or deleted already) deletes nothing (DBOS's answer): an empty
        ``Deleted``, so deleting twice is harmless."""
        return await self.history.delete_run(run_id, actor=actor)
