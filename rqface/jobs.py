"""rq's ``Job`` for runfleet: the same names and meanings, read from the durable run.

A ``Job`` is a snapshot of one run's row, refreshed on demand, as rq's is of its
Redis hash. Statuses map onto run statuses (``job_status``). ``job.result`` is rq's
(deprecated) property, the value or None; ``job.wait(timeout)`` is runfleet's call that
waits for the settlement.
"""

from __future__ import annotations

import builtins
import enum
import sys
import uuid
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, NamedTuple

from runfleet.broker.notify import SettledMark
from runfleet.producer.admission import call_arguments
from runfleet.producer.queue import AsyncQueue
from runfleet.producer.run import AsyncRun, is_dead, outcome
from runfleet.rqface.call_site import called_at_site
from runfleet.rqface.connection import Connection
from runfleet.rqface.perform import perform, resolve_loaded
from runfleet.rqface.rq_api import DEFAULT_JOB_TIMEOUT, InvalidJobOperation, refuse_pipeline
from runfleet.store.errors import RunNotFound
from runfleet.store.jobs import Activation, Jobs
from runfleet.store.registries import Registries
from runfleet.store.types import CancelOutcome, RunRow, RunStatus, WaitingReason

NoSuchJobError = RunNotFound
"""rq's name for "no job with this id" (``Job.fetch``)."""


class JobStatus(enum.StrEnum):
    """rq's job statuses; ``job_status`` says which run state each one names."""

    QUEUED = "queued"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELED = "canceled"
    SCHEDULED = "scheduled"
    DEFERRED = "deferred"
    STOPPED = "stopped"
    DEAD = "dead"
    """Not rq's: parked ``dead`` at the recovery limit (a resume or a cancel moves it)."""


def job_status(row: RunRow, deferred: bool = False) -> JobStatus:
    """The rq status of a run (its last round's, for a run that handed off).

    Any open run whose cancellation was requested → canceled, as rq's ``cancel`` answers
    at once: the cancel guard settles it cancelled (a pending one is even claimed for an
    instant by the worker that closes it, which must not read as started). Otherwise
    pending → queued, or scheduled while its start time (enqueue_at/in) is in the
    future; any open run is deferred (``deferred``: the caller read its dependencies)
    while a ``depends_on`` dependency has not completed; a run parked dead → dead; running
    and suspended (parked on a wait: it has started) → started; completed → finished;
    failed → failed; cancelled → canceled.
    """
    if row.state.get("stopped") and (
        row.status is RunStatus.CANCELLED or row.cancel_requested_at_ms is not None
    ):
        return JobStatus.STOPPED  # ``send_stop_job_command``: cancelled while it ran
    if not row.status.terminal:
        if row.cancel_requested_at_ms is not None:
            return JobStatus.CANCELED
        if deferred:
            return JobStatus.DEFERRED
    if row.status is RunStatus.FAILED and row.state.get("canceled"):
        return JobStatus.CANCELED  # rq's cancel of a failed job (``Job.cancel``)
    if is_dead(row):
        return JobStatus.DEAD
    if row.status is RunStatus.PENDING:
        waiting = row.waiting
        if (
            waiting is not None
            and waiting.reason == WaitingReason.TIMER
            and (waiting.wake_at_ms or 0) > row.now_ms
        ):
            return JobStatus.SCHEDULED
        return JobStatus.QUEUED
    if retry_scheduled(row):
        return JobStatus.SCHEDULED
    return {
        RunStatus.RUNNING: JobStatus.STARTED,
        RunStatus.SUSPENDED: JobStatus.STARTED,
        RunStatus.COMPLETED: JobStatus.FINISHED,
        RunStatus.FAILED: JobStatus.FAILED,
        RunStatus.CANCELLED: JobStatus.CANCELED,
    }[row.status]


def _expired(row: RunRow) -> bool:
    """Past its ``result_ttl`` (completed) or ``failure_ttl`` (failed): rq's key has
    expired, so rq's reads answer "no such job" at once, though retention deletes the row
    at its next pass (up to a minute later)."""
    key = {RunStatus.COMPLETED: "result_ttl", RunStatus.FAILED: "failure_ttl"}.get(row.status)
    ttl = row.state.get(key) if key else None
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
        return False
    return row.now_ms >= row.updated_at_ms + ttl * 1000


def _when(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


class ResultType(enum.Enum):
    """rq's ``Result.Type``."""

    SUCCESSFUL = 1
    FAILED = 2
    STOPPED = 3


@dataclass(frozen=True)
class Result:
    """rq's ``Result``: what ``latest_result()`` answers once the run settled."""

    job_id: str
    type: ResultType
    return_value: Any = None
    exc_string: str | None = None
    created_at: datetime | None = None
    worker_name: str | None = None
    """The worker process that settled it (its owner key, ``host:pid:nonce``)."""
    Type: ClassVar[builtins.type[ResultType]] = ResultType

    @classmethod
    def fetch_latest(cls, job: Job, serializer: Any = None, timeout: float = 0) -> Result | None:
        """rq's ``Result.fetch_latest(job)``: ``job.latest_result(timeout)``."""
        return job.latest_result(timeout)

    @classmethod
    def all(cls, job: Job, serializer: Any = None) -> list[Result]:
        """rq's ``Result.all(job)``: every execution's result, newest first."""
        return job.results()

    @classmethod
    def count(cls, job: Job) -> int:
        """rq's ``Result.count(job)``: how many executions have settled."""
        return len(job.results())


def retry_scheduled(row: RunRow) -> bool:
    """A job with rq's ``retry=`` parked on its retry interval (rq: scheduled)."""
    waiting = row.waiting
    return (
        row.status is RunStatus.SUSPENDED
        and bool(row.state.get("retry"))
        and waiting is not None
        and waiting.reason == WaitingReason.TIMER
    )


class CreatedCall(NamedTuple):
    """What ``Job.create`` holds until ``Queue.enqueue_job`` admits it."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]


class JobRead(NamedTuple):
    """``read_job``'s answer."""

    row: RunRow
    """The row that answers for the rq id."""
    started_ms: int | None
    """When it first started, or None."""
    worker: str | None
    """The worker process that started it last (its owner key), or None."""
    deferred: bool
    """Waiting for its dependencies (rq's deferred registry)."""


async def read_job(queue: AsyncQueue, run_id: str) -> JobRead:
    """The row that answers for ``run_id`` and when it first started (ms), scope-checked.

    A run that handed off answers with its lineage's last round; a failed run that
    was requeued, with the round that replaced it (rq keeps one id across a requeue).
    """
    row = await _answering(queue, run_id, await queue.authorized(run_id))
    jobs = Jobs(queue.store)
    activation, deferred = Activation(None, None), False
    if row.depends_on and not row.status.terminal:
        ids = list(row.depends_on)
        registries = Registries(queue.store)
        allow = bool(row.state.get("allow_failure"))
        gate = await queue.session.available(lambda: registries.dependencies_met(ids, allow))
        deferred = not gate.met
    if row.status is not RunStatus.PENDING and not deferred:
        activation = await queue.session.available(lambda: jobs.activation(row.id))
    return JobRead(row, activation.started_ms, activation.worker, deferred)


async def _answering(queue: AsyncQueue, run_id: str, row: RunRow) -> RunRow:
    """The round that answers for ``run_id``, from its own ``row``: a run that handed off
    answers with its lineage's last round; a failed run that was requeued, with the round
    that replaced it (rq keeps one id across a requeue). RunNotFound once rq's delete or
    ttl removed the job (the row awaits prune)."""
    while True:
        row = await AsyncRun(queue, row.id)._last_round(row)
        following = row.requeued_as
        if row.status is not RunStatus.FAILED or not following:
            break
        row = await queue.authorized(following)
    if row.state.get("deleted") or _expired(row):
        raise RunNotFound(run_id)
    return row


def _settles(row: RunRow) -> bool:
    """Whether the run's own row settles what its id answers: terminal, and no other round
    answers for it (it did not hand off, was not requeued after failing, nor resumed)."""
    if not row.status.terminal or row.handed_off_to or row.resumed_as:
        return False
    return not (row.status is RunStatus.FAILED and row.requeued_as)


async def settled_row(queue: AsyncQueue, run_id: str) -> RunRow | None:
    """The run's row, scope-checked, if that one read settles what it answers
    (``_settles``). None otherwise: ``read_job`` then follows the rounds."""
    row = await queue.authorized(run_id)
    return row if _settles(row) else None


async def waited_round(queue: AsyncQueue, run_id: str) -> RunRow:
    """What ``Job.wait`` reads first: the run's row if it settles what it answers, else the
    round that answers for it (``_answering``), usually from that one read."""
    row = await queue.authorized(run_id)
    return row if _settles(row) else await _answering(queue, run_id, row)


_RESULT_READ = "job.result is deprecated, use job.return_value instead."
"""rq 3's own warning for reading ``job.result``, word for word."""
_RESULT_CALLED = (
    "job.result(timeout) is deprecated, use job.wait(timeout): it waits the same way "
    "(job.result is rq's property now: the return value, or None)"
)
_EXC_INFO_READ = "job.exc_info is deprecated, use job.latest_result() instead."
"""rq 3's own warning for reading ``job.exc_info``, word for word."""


class Job:
    """One run, as rq's ``Job``: status predicates, result, meta, timestamps, cancel."""

    def __init__(
        self,
        queue: Connection | str,
        run_id: str | None = None,
        *,
        connection: Connection | None = None,
        settled_mark: SettledMark | None = None,
    ) -> None:
        """``settled_mark``: the admission's (``Queue._admitted``), for ``wait``."""
        # runfleet's Job(queue, run_id), or rq's Job(id, connection=queue)
        owner, job_id = (connection, queue) if isinstance(queue, str) else (queue, run_id)
        if owner is None or not isinstance(job_id, str):
            raise TypeError("Job(id, connection=<runfleet Queue>)")
        self._queue: Connection = owner
        self.id = job_id
        self._row: RunRow | None = None
        self._started_ms: int | None = None
        self._worker: str | None = None
        self._created: CreatedCall | None = None
        self._deferred = False
        self._meta: dict[str, Any] | None = None
        self._settled_mark = settled_mark

    @property
    def meta(self) -> dict[str, Any]:
        """rq's ``job.meta``: read with the job (at the first access), kept until refresh."""
        if self._meta is None:
            self.refresh()
        assert self._meta is not None
        return self._meta

    @meta.setter
    def meta(self, value: dict[str, Any]) -> None:
        self._meta = value

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    # ---- fetching ----------------------------------------------------------

    @classmethod
    def fetch(cls, id: str, connection: Connection) -> Job:
        """rq's ``Job.fetch``; ``connection`` is a runfleet ``Queue``. NoSuchJobError if absent."""
        job = cls(connection, id)
        job.refresh()
        return job

    @classmethod
    def create(
        cls,
        func: Any,
        args: Iterable[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        connection: Connection | None = None,
        *,
        id: str | None = None,
        timeout: Any = None,
        serializer: Any = None,
        **options: Any,
    ) -> Job:
        """rq's ``Job.create``: a job not yet enqueued; ``queue.enqueue_job(job)`` admits it.

        ``connection`` is a runfleet ``Queue``; ``options`` are enqueue's rq options
        (``meta``, ``description``, ``depends_on``, ``result_ttl``, ...), ``timeout`` is
        rq's ``job_timeout``. Nothing is written until it is enqueued.
        """
        if connection is None:
            raise TypeError("Job.create(..., connection=<runfleet Queue>)")
        options.pop("origin", None)  # rq's: the queue it is enqueued on decides
        options.pop("status", None)
        if timeout is not None:
            options["job_timeout"] = timeout
        job = cls(connection, id or uuid.uuid4().hex)
        job._created = CreatedCall(func, *call_arguments(args, kwargs), options)
        return job

    @classmethod
    def fetch_many(cls, job_ids: Iterable[str], connection: Connection) -> list[Job | None]:
        """rq's ``Job.fetch_many``: a Job per id, None where no such run exists."""
        found: list[Job | None] = []
        for job_id in job_ids:
            try:
                found.append(cls.fetch(job_id, connection))
            except NoSuchJobError:
                found.append(None)
        return found

    def refresh(self) -> None:
        """Re-read the run (rq's ``refresh()``): status, meta and timestamps."""
        read = self._queue._now(lambda q: read_job(q, self.id))
        self._row, self._started_ms, self._deferred = read.row, read.started_ms, read.deferred
        self._worker = read.worker
        self._meta = self._row.meta

    @property
    def _current(self) -> RunRow:
        if self._row is None:
            self.refresh()
        assert self._row is not None
        return self._row

    # ---- status ------------------------------------------------------------

    def get_status(self, refresh: bool = True) -> JobStatus:
        """rq's ``get_status``; InvalidJobOperation (rq's) once the job was deleted."""
        if refresh or self._row is None:
            try:
                self.refresh()
            except NoSuchJobError:
                raise InvalidJobOperation(f"Failed to retrieve status for job: {self.id}") from None
        return job_status(self._current, self._deferred)

    @property
    def is_queued(self) -> bool:
        return self.get_status() is JobStatus.QUEUED

    @property
    def is_started(self) -> bool:
        return self.get_status() is JobStatus.STARTED

    @property
    def is_finished(self) -> bool:
        return self.get_status() is JobStatus.FINISHED

    @property
    def is_failed(self) -> bool:
        return self.get_status() is JobStatus.FAILED

    @property
    def is_canceled(self) -> bool:
        return self.get_status() is JobStatus.CANCELED

    @property
    def is_stopped(self) -> bool:
        """rq's: stopped while it ran (``send_stop_job_command``)."""
        return self.get_status() is JobStatus.STOPPED

    @property
    def is_scheduled(self) -> bool:
        return self.get_status() is JobStatus.SCHEDULED

    @property
    def is_deferred(self) -> bool:
        return self.get_status() is JobStatus.DEFERRED

    @property
    def priority(self) -> int:
        """The run's priority as admitted (not rq's: docs/how-to/queues.md)."""
        return self._current.priority

    @property
    def dedup_key(self) -> str | None:
        """The ``dedup_key`` the run was admitted with, or None (not rq's)."""
        return self._current.dedup_key

    # ---- results -----------------------------------------------------------

    @property
    def result(self) -> Any:
        """rq's ``job.result``: the return value of the latest successful execution, None
        until there is one (before it finished, or when it failed or was cancelled).

        rq 3 deprecates it for ``return_value()`` and warns so; this warns the same. The
        spelling ``job.result(timeout)`` / ``job.result()``, which waited before the waiting
        call was named ``wait``, still waits and warns ``DeprecationWarning`` naming
        ``job.wait``: the call is told from a read at its site (``called_at_site``). A
        result is JSON, never callable, so no rq code calls it. Handed on uncalled
        (``to_thread(job.result, 30)``) it is the value: hand on ``job.wait``.
        """
        if called_at_site(sys._getframe(1), "result"):
            warnings.warn(_RESULT_CALLED, DeprecationWarning, stacklevel=2)
            return self.wait
        warnings.warn(_RESULT_READ, DeprecationWarning, stacklevel=2)
        return self.return_value()

    def wait(self, timeout: float = 30.0) -> Any:
        """Wait until the run settles; its result, or RunFailed / RunCancelled / TimeoutError.

        Waits on the round that answers for this id (a requeued run's new round); a
        settled run answers from one indexed read. ``AsyncRun.wait`` is its async twin.
        """
        queue = self._queue._async
        if self._queue._settled_shared():
            # Other waits keep the loop's settled subscription up: entering it is free, so
            # the loop thread's one read answers a settled run as a read here would, and an
            # open one waits with no second read.
            run = AsyncRun(
                queue,
                self.id,
                created=self._settled_mark is not None,
                settled_mark=self._settled_mark,
            )
            return self._queue._call(
                run.wait_open(timeout, seen_open=True, answering=lambda i: waited_round(queue, i))
            )
        row = self._queue._now(lambda q: waited_round(q, self.id))  # in this thread
        if row.status.terminal or is_dead(row):
            return outcome(row)
        answering = AsyncRun(queue, row.id)
        return self._queue._call(answering.wait_open(timeout, seen_open=True))

    def return_value(self, refresh: bool = False) -> Any:
        """The result if the run completed, else None (never waits), as rq's.

        rq caches a settled result; so does this: a run not yet completed is re-read. A
        job ``Job.create`` made and no queue admitted yet has none.
        """
        if self._created is not None:
            return None
        if refresh or self._row is None or self._row.status is not RunStatus.COMPLETED:
            settled = self._queue._now(lambda q: settled_row(q, self.id))
            if settled is not None:  # one indexed read answers it
                return settled.result if settled.status is RunStatus.COMPLETED else None
            self.refresh()
        row = self._current
        return row.result if row.status is RunStatus.COMPLETED else None

    def latest_result(self, timeout: float = 0) -> Result | None:
        """rq's ``latest_result``: None until the run settled (waits up to ``timeout`` s)."""
        if timeout > 0:
            try:
                self.wait(timeout)
            except Exception:  # failed, cancelled or still open: read below
                pass
        if self._row is None or self._row.status is not RunStatus.COMPLETED:
            self.refresh()  # only a completed run never changes (a failed one may be requeued)
        return _result_of(self.id, self._current, self.worker_name)

    @property
    def worker_name(self) -> str | None:
        """rq's ``job.worker_name``: the worker process that runs or ran it (its owner key,
        ``host:pid:nonce``), None before any worker started it."""
        owner = self._current.owner
        return owner.key if owner is not None else self._worker

    @property
    def exc_info(self) -> str | None:
        """The failure's traceback text (rq's ``exc_info``), None unless the run failed.

        rq 3 deprecates it for ``latest_result().exc_string`` and warns so; this warns the
        same."""
        warnings.warn(_EXC_INFO_READ, DeprecationWarning, stacklevel=2)
        return _exc_text(self._current)

    # ---- meta --------------------------------------------------------------

    def get_meta(self, refresh: bool = True) -> dict[str, Any]:
        if refresh:
            self.refresh()
        return self.meta

    def save_meta(self) -> None:
        """Store ``meta`` on the run (rq's ``save_meta``); any JSON object."""
        queue = self._queue._async

        async def save() -> None:
            await queue.authorized(self.id)
            jobs = Jobs(queue.store)
            if not await queue.session.available(lambda: jobs.save_meta(self.id, self.meta)):
                raise NoSuchJobError(self.id)

        self._queue._call(save())

    # ---- fields ------------------------------------------------------------

    @property
    def origin(self) -> str:
        return self._current.queue

    @property
    def func_name(self) -> str:
        """``module.function`` as rq spells it (a ``@flow``'s registered name otherwise)."""
        flow = self._current.flow
        return self._current.func_name or flow.replace(":", ".")

    @property
    def func(self) -> Any:
        """rq's ``job.func``: the function, from a module this process has already loaded
        (a producer imports nothing a row names); None when it is not loaded here."""
        return resolve_loaded(self._current.flow)

    @property
    def instance(self) -> None:
        """rq's ``job.instance`` (the object of a method job): runfleet enqueues functions
        and flows, never bound methods, so there is none."""
        return None

    @property
    def args(self) -> tuple[Any, ...]:
        """The positional arguments, a tuple as rq's."""
        payload = self._current.payload
        return tuple(payload.get("args") or ()) if isinstance(payload, dict) else ()

    @property
    def kwargs(self) -> dict[str, Any]:
        payload = self._current.payload
        return dict(payload.get("kwargs") or {}) if isinstance(payload, dict) else {}

    @property
    def description(self) -> str:
        given = self._current.description
        if given:
            return given
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.func_name}({', '.join(parts)})"

    @property
    def enqueued_at(self) -> datetime | None:
        return _when(self._current.created_at_ms)

    @property
    def started_at(self) -> datetime | None:
        self._current  # noqa: B018 - read the row once if never read
        return _when(self._started_ms)

    @property
    def ended_at(self) -> datetime | None:
        row = self._current
        return _when(row.updated_at_ms) if row.status.terminal else None

    # ---- changes -----------------------------------------------------------

    def cancel(
        self,
        *,
        actor: str | None = None,
        enqueue_dependents: bool = False,
        pipeline: Any = None,
        remove_from_dependencies: bool = False,
    ) -> CancelOutcome:
        """Durably cancel the run (rq's ``cancel``; a running body is interrupted too).

        InvalidJobOperation (rq's) if it is canceled already. ``enqueue_dependents``: its
        dependents no longer wait for it (rq enqueues them: they run as if it completed).
        ``remove_from_dependencies``: its dependencies no longer list it among their
        ``dependent_ids``.
        A failed job moves to the canceled registry, as rq's does: the run stays failed
        (terminal is never left) and carries a ``canceled`` marker that rq's reads follow.
        """
        refuse_pipeline(pipeline)
        if self.get_status() is JobStatus.CANCELED:
            raise InvalidJobOperation(f"Cannot cancel already canceled job: {self.id}")
        row = self._current
        if row.status is RunStatus.FAILED:
            self._queue._rq.mark("canceled", [row.id])
        outcome = self._queue.cancel(row.id, actor=actor)
        if enqueue_dependents:
            self._queue._rq.mark("dependents_released", [row.id])
        if remove_from_dependencies:
            self._queue._rq.mark("removed_from_dependencies", [row.id])
        self._row = None
        return outcome

    def delete(
        self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False
    ) -> None:
        """rq's ``delete``: the job is gone for rq's reads (``Job.fetch`` raises
        NoSuchJobError, ``Job.exists`` is False, no registry or queue lists it); an open
        run is durably cancelled first. The row itself stays until ``runfleet prune``
        removes it with its journal (durable runs are never deleted behind their audit
        trail). ``delete_dependents`` deletes the jobs that depend on it too."""
        refuse_pipeline(pipeline)
        row = self._current
        if not row.status.terminal and row.cancel_requested_at_ms is None:
            self._queue.cancel(row.id, actor="delete")
        ids = [row.id]
        if delete_dependents:
            ids += self.dependent_ids
        self._queue._rq.mark("deleted", ids)
        self._row = None

    # ---- rq's remaining Job surface ----------------------------------------

    @classmethod
    def exists(cls, job_id: str, connection: Connection) -> bool:
        """rq's ``Job.exists``: a run with this id that rq's delete has not removed."""
        try:
            cls.fetch(job_id, connection)
        except NoSuchJobError:
            return False
        return True

    @property
    def timeout(self) -> int | float | None:
        """rq's ``job.timeout`` in seconds: as given (``job_timeout=`` or the queue's
        ``default_timeout``), else rq's ``DEFAULT_JOB_TIMEOUT`` for a plain function (its
        name is ``module:function``) and None for a flow."""
        row = self._current
        value = row.state.get("job_timeout")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        return DEFAULT_JOB_TIMEOUT if ":" in row.flow else None

    @property
    def result_ttl(self) -> int | None:
        value = self._current.state.get("result_ttl")
        return value if isinstance(value, int) else None

    @property
    def failure_ttl(self) -> int | None:
        value = self._current.state.get("failure_ttl")
        return value if isinstance(value, int) else None

    @property
    def ttl(self) -> int | None:
        """rq's ``ttl``: how long the job may wait (here: a deadline from admission)."""
        value = self._current.state.get("ttl")
        return value if isinstance(value, int) else None

    def get_ttl(self, default_ttl: int | None = None) -> int | None:
        return self.ttl if self.ttl is not None else default_ttl

    def get_result_ttl(self, default_ttl: int | None = None) -> int | None:
        return self.result_ttl if self.result_ttl is not None else default_ttl

    @property
    def retries_left(self) -> int | None:
        """rq's ``retries_left``: ``Retry.max`` until the job failed for good (then 0)."""
        retry = self._current.state.get("retry")
        if not isinstance(retry, dict):
            return None
        return 0 if self._current.status is RunStatus.FAILED else int(retry.get("max") or 0)

    @property
    def retry_intervals(self) -> list[int | float] | None:
        retry = self._current.state.get("retry")
        if not isinstance(retry, dict):
            return None
        return [int(i) if float(i).is_integer() else float(i) for i in retry.get("intervals") or []]

    @property
    def dependency_ids(self) -> list[str]:
        ids = self._current.state.get("dependency_ids") or self._current.state.get("depends_on")
        return [str(i) for i in ids] if isinstance(ids, list) else []

    @property
    def _dependency_ids(self) -> list[str]:
        return self.dependency_ids

    @property
    def _dependency_id(self) -> str | None:
        ids = self.dependency_ids
        return ids[0] if ids else None

    @property
    def dependency(self) -> Job | None:
        """rq's ``job.dependency``: the first dependency, fetched."""
        first = self._dependency_id
        return None if first is None else Job.fetch(first, self._queue)

    def fetch_dependencies(self) -> list[Job]:
        return [j for j in Job.fetch_many(self.dependency_ids, self._queue) if j is not None]

    @property
    def allow_dependency_failures(self) -> bool:
        return bool(self._current.state.get("allow_failure"))

    @property
    def dependent_ids(self) -> list[str]:
        """Ids of the jobs that depend on this one (rq's ``dependent_ids``)."""
        return self._queue._rq.dependents(self._current.id)

    def dependencies_are_met(self, parent_job: Job | None = None) -> bool:
        """rq's ``dependencies_are_met``: every dependency finished (or failed, with
        ``allow_failure``), or deleted."""
        return self._queue._rq.dependencies_met(self.dependency_ids, self.allow_dependency_failures)

    def _callback(self, kind: str) -> Any:
        callbacks = self._current.state.get("callbacks")
        name = callbacks.get(kind) if isinstance(callbacks, dict) else None
        return None if name is None else resolve_loaded(str(name))

    @property
    def success_callback(self) -> Any:
        """rq's ``success_callback``: the function, resolved among the modules this
        process has loaded (a producer imports nothing a string names)."""
        return self._callback("on_success")

    @property
    def failure_callback(self) -> Any:
        return self._callback("on_failure")

    @property
    def stopped_callback(self) -> Any:
        return self._callback("on_stopped")

    def _callback_timeout(self, kind: str) -> int | None:
        timeouts = self._current.state.get("callback_timeouts")
        value = timeouts.get(kind) if isinstance(timeouts, dict) else None
        return value if isinstance(value, int) else None

    @property
    def success_callback_timeout(self) -> int | None:
        return self._callback_timeout("on_success")

    @property
    def failure_callback_timeout(self) -> int | None:
        return self._callback_timeout("on_failure")

    @property
    def failed_job_registry(self) -> Any:
        return self._queue.sibling(self.origin).failed_job_registry

    def get_position(self) -> int | None:
        """rq's ``get_position``: the job's index in its queue, None if not queued."""
        try:
            origin = self.origin
        except NoSuchJobError:
            return None
        return self._queue.sibling(origin).get_job_position(self.id)

    def get_call_string(self) -> str:
        return self.description

    def save(self, pipeline: Any = None, include_meta: bool = True) -> None:
        """rq's ``save``: what a producer may change on an enqueued job is its ``meta``
        (arguments and options are the durable admission and never rewritten)."""
        refuse_pipeline(pipeline)
        if include_meta:
            self.save_meta()

    def perform(self) -> Any:
        """rq's ``perform``: run the job's function here, now, and return its value
        (nothing is recorded: the durable run is the worker's)."""
        return perform(self, self._current.flow, self.args, self.kwargs)

    def requeue(self, at_front: bool = False) -> Job:
        """rq's ``job.requeue()``: the failed-registry requeue."""
        again: Job = self.failed_job_registry.requeue(self, at_front=at_front)
        return again

    def results(self) -> list[Result]:
        """rq's ``results()``: one per execution that settled, newest first: a failed run
        that was requeued keeps its failure beside the round that replaced it."""
        queue = self._queue._async

        async def rounds() -> list[Result | None]:
            jobs = Jobs(queue.store)
            row = await queue.authorized(self.id)
            rows = [row]
            while row.status is RunStatus.FAILED and row.requeued_as:
                row = await queue.authorized(row.requeued_as)
                rows.append(row)
            found = []
            for each in reversed(rows):
                worker = (await jobs.activation(each.id)).worker
                found.append(_result_of(self.id, each, worker))
            return found

        results: list[Result | None] = self._queue._call(rounds())
        return [result for result in results if result is not None]


def _exc_text(row: RunRow) -> str | None:
    """A failed run's traceback text (rq's ``exc_info``), None unless it failed."""
    error = row.error
    if row.status is not RunStatus.FAILED or error is None:
        return None
    return error.traceback or f"{error.type}: {error.message}"


def _result_of(job_id: str, row: RunRow, worker: str | None) -> Result | None:
    """rq's ``Result`` of one settled round (``worker``: its process), None while open."""
    when = _when(row.updated_at_ms)
    if row.status is RunStatus.COMPLETED:
        return Result(job_id, ResultType.SUCCESSFUL, row.result, None, when, worker)
    if row.status is RunStatus.FAILED:
        return Result(job_id, ResultType.FAILED, None, _exc_text(row), when, worker)
    if row.status is RunStatus.CANCELLED:
        return Result(job_id, ResultType.STOPPED, None, None, when, worker)
    return None


__all__ = ["Job", "JobStatus", "NoSuchJobError", "Result", "ResultType"]
