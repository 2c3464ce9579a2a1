"""rq's ``Job`` for runfleet: the same names and meanings, read from the durable run.

A ``Job`` is a snapshot of one run's row, refreshed on demand, as rq's is of its
Redis hash. Statuses map onto run statuses (``job_status``); the one place the
names differ in meaning is ``result``: rq's deprecated ``job.result`` property is
runfleet's blocking ``result(timeout)`` method, so use ``return_value()`` (rq's own
recommendation) in code meant to run on both.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runfleet.broker.run import AsyncRun
from runfleet.store.errors import RunNotFound
from runfleet.store.jobs import Jobs
from runfleet.store.types import CancelOutcome, RunRow, RunStatus, WaitingReason

if TYPE_CHECKING:
    from runfleet.broker.queue import AsyncQueue
    from runfleet.broker.sync import Queue

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


def job_status(row: RunRow, deferred: bool = False) -> JobStatus:
    """The rq status of a run (its last round's, for a run that handed off).

    Any open run whose cancellation was requested → canceled, as rq's ``cancel`` answers
    at once: the cancel guard settles it cancelled (a pending one is even claimed for an
    instant by the worker that closes it, which must not read as started). Otherwise
    pending → queued, or scheduled while its start time (enqueue_at/in) is in the
    future; any open run is deferred (``deferred``: the caller read its dependencies)
    while a ``depends_on`` dependency has not completed; running and suspended (parked
    on a wait: it has started) → started; completed → finished; failed → failed;
    cancelled → canceled.
    """
    if not row.status.terminal:
        if row.cancel_requested_at_ms is not None:
            return JobStatus.CANCELED
        if deferred:
            return JobStatus.DEFERRED
    if row.status is RunStatus.PENDING:
        waiting = row.waiting
        if (
            waiting is not None
            and waiting.reason == WaitingReason.TIMER
            and (waiting.wake_at_ms or 0) > row.now_ms
        ):
            return JobStatus.SCHEDULED
        return JobStatus.QUEUED
    return {
        RunStatus.RUNNING: JobStatus.STARTED,
        RunStatus.SUSPENDED: JobStatus.STARTED,
        RunStatus.COMPLETED: JobStatus.FINISHED,
        RunStatus.FAILED: JobStatus.FAILED,
        RunStatus.CANCELLED: JobStatus.CANCELED,
    }[row.status]


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


async def read_job(queue: AsyncQueue, run_id: str) -> tuple[RunRow, int | None, bool]:
    """The row that answers for ``run_id`` and when it first started (ms), scope-checked.

    A run that handed off answers with its lineage's last round; a failed run that
    was requeued, with the round that replaced it (rq keeps one id across a requeue).
    """
    row = await queue.authorized(run_id)
    while True:
        row = await AsyncRun(queue, row.id)._last_round(row)
        following = row.requeued_as
        if row.status is not RunStatus.FAILED or not following:
            break
        row = await queue.authorized(following)
    jobs = Jobs(queue.store)
    started, deferred = None, False
    if row.depends_on and not row.status.terminal:
        ids = list(row.depends_on)
        done, _broken = await queue._available(lambda: jobs.dependencies_done(ids))
        deferred = not done
    if row.status is not RunStatus.PENDING and not deferred:
        started = await queue._available(lambda: jobs.started_at_ms(row.id))
    return row, started, deferred


class Job:
    """One run, as rq's ``Job``: status predicates, result, meta, timestamps, cancel."""

    def __init__(self, queue: Queue, run_id: str) -> None:
        self._queue = queue
        self.id = run_id
        self._row: RunRow | None = None
        self._started_ms: int | None = None
        self._deferred = False
        self.meta: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    # ---- fetching ----------------------------------------------------------

    @classmethod
    def fetch(cls, id: str, connection: Queue) -> Job:
        """rq's ``Job.fetch``; ``connection`` is a runfleet ``Queue``. NoSuchJobError if absent."""
        job = cls(connection, id)
        job.refresh()
        return job

    @classmethod
    def fetch_many(cls, job_ids: Iterable[str], connection: Queue) -> list[Job | None]:
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
        read = self._queue._call(read_job(self._queue._async, self.id))
        self._row, self._started_ms, self._deferred = read
        self.meta = self._row.meta

    @property
    def _current(self) -> RunRow:
        if self._row is None:
            self.refresh()
        assert self._row is not None
        return self._row

    # ---- status ------------------------------------------------------------

    def get_status(self, refresh: bool = True) -> JobStatus:
        if refresh or self._row is None:
            self.refresh()
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
    def is_scheduled(self) -> bool:
        return self.get_status() is JobStatus.SCHEDULED

    @property
    def is_deferred(self) -> bool:
        return self.get_status() is JobStatus.DEFERRED

    # ---- results -----------------------------------------------------------

    def result(self, timeout: float = 30.0) -> Any:
        """Wait until the run settles: its result, or RunFailed / RunCancelled / TimeoutError.

        Not rq's deprecated ``result`` property: use ``return_value()`` for that meaning.
        Waits on the round that answers for this id (a requeued run's new round).
        """
        self.refresh()
        answering = AsyncRun(self._queue._async, self._current.id)
        return self._queue._call(answering.result(timeout))

    def return_value(self, refresh: bool = False) -> Any:
        """The result if the run completed, else None (never waits), as rq's.

        rq caches a settled result; so does this: a run not yet completed is re-read.
        """
        if refresh or self._row is None or self._row.status is not RunStatus.COMPLETED:
            self.refresh()
        row = self._current
        return row.result if row.status is RunStatus.COMPLETED else None

    def latest_result(self, timeout: float = 0) -> Result | None:
        """rq's ``latest_result``: None until the run settled (waits up to ``timeout`` s)."""
        if timeout > 0:
            try:
                self.result(timeout)
            except Exception:  # failed, cancelled or still open: read below
                pass
        if self._row is None or self._row.status is not RunStatus.COMPLETED:
            self.refresh()  # only a completed run never changes (a failed one may be requeued)
        row = self._current
        when = _when(row.updated_at_ms)
        if row.status is RunStatus.COMPLETED:
            return Result(self.id, ResultType.SUCCESSFUL, row.result, None, when)
        if row.status is RunStatus.FAILED:
            return Result(self.id, ResultType.FAILED, None, self.exc_info, when)
        if row.status is RunStatus.CANCELLED:
            return Result(self.id, ResultType.STOPPED, None, None, when)
        return None

    @property
    def exc_info(self) -> str | None:
        """The failure's traceback text (rq's ``exc_info``), None unless the run failed."""
        row = self._current
        error = row.error
        if row.status is not RunStatus.FAILED or not isinstance(error, dict):
            return None
        text = error.get("traceback") or f"{error.get('type')}: {error.get('message')}"
        return str(text)

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
            if not await queue._available(lambda: jobs.save_meta(self.id, self.meta)):
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

    def cancel(self, *, actor: str | None = None) -> CancelOutcome:
        """Durably cancel the run (rq's ``cancel``; a running body is interrupted too)."""
        return self._queue.cancel(self.id, actor=actor)

    def delete(self) -> None:
        """rq's ``delete``: cancel the run if still open. The row itself stays until
        ``runfleet prune`` removes it with the run's journal (durable runs are never
        deleted behind their audit trail)."""
        if not self._current.status.terminal:
            self.cancel(actor="delete")


class FailedJobRegistry:
    """rq's ``queue.failed_job_registry``: the queue's failed runs not yet requeued."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self.name = queue.name

    def get_job_ids(self, start: int = 0, end: int = -1) -> list[str]:
        """Ids, oldest failure first; ``start``/``end`` are inclusive, as rq's."""
        ids = self._queue._call(self._queue._async.failed_ids())
        return ids[start:] if end < 0 else ids[start : end + 1]

    @property
    def count(self) -> int:
        return len(self.get_job_ids())

    def __len__(self) -> int:
        return self.count

    def __contains__(self, item: object) -> bool:
        job_id = item.id if isinstance(item, Job) else item
        return job_id in self.get_job_ids()

    def requeue(self, job_or_id: Job | str, at_front: bool = False) -> Job:
        """Run a failed job again: a new round of its run, read through the same id."""
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        self._queue._call(self._queue._async.requeue(job_id, actor="failed_job_registry"))
        job = Job(self._queue, job_id)
        job.refresh()
        return job
