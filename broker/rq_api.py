"""rq's module-level producer names over runfleet: ``Dependency``, the ``@job`` decorator,
``cancel_job``, ``requeue_job``, ``InvalidJobOperation`` and rq's job-id rule.

Each one is rq's signature with rq's meaning; ``connection`` is a runfleet ``Queue`` where
rq takes a Redis client (the one-line change the README's mapping table names).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from runfleet.store.errors import InvalidInput, RunfleetError

if TYPE_CHECKING:
    from runfleet.broker.jobs import Job
    from runfleet.broker.sync import Queue


class InvalidJobOperation(RunfleetError):
    """rq's ``InvalidJobOperation``: cancelling a cancelled job, requeueing one that did
    not fail."""


DEFAULT_JOB_TIMEOUT = 180
"""rq's default ``job_timeout`` in seconds: a plain function enqueued without one (nor a
queue ``default_timeout``) fails with ``JobTimeoutException`` past it."""


class JobTimeoutException(Exception):
    """rq's ``JobTimeoutException``: a job ran past its ``job_timeout``; the job fails with
    it (in ``exc_info`` and the failed registry), as in rq."""


class DuplicateJobError(RunfleetError):
    """rq's ``DuplicateJobError``: ``enqueue(..., job_id=, unique=True)`` of an id in use."""


class JobIdTypeError(InvalidInput, TypeError):
    """``job_id`` that is not a string: rq raises TypeError, runfleet's InvalidInput too."""


JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
"""rq's job-id rule (``rq.job.JOB_ID_PATTERN``), applied to rq's ``job_id=``: letters,
digits, ``_`` and ``-``. runfleet's own ``run_id=`` keeps its wider rule."""


def rq_job_id(job_id: object) -> str:
    if not isinstance(job_id, str):
        raise JobIdTypeError("job_id", f"must be a string, got {type(job_id).__name__}")
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise InvalidInput(
            "job_id", f"{job_id!r}: rq's job ids are letters, digits, '_' and '-' only"
        )
    return job_id


def refuse_pipeline(pipeline: object) -> None:
    """rq's ``pipeline=``: runfleet's calls are Postgres transactions, not a Redis pipeline
    to join, so one passed is refused rather than silently ignored."""
    if pipeline is not None:
        raise InvalidInput(
            "pipeline", "rq's pipeline= is not supported (docs/how-to/moving-from-rq.md)"
        )


class Dependency:
    """rq's ``Dependency(jobs, allow_failure=False, enqueue_at_front=False)``.

    ``jobs``: a job, an id, or a list of them. ``allow_failure``: the dependent runs once
    every dependency ended, completed or failed (a cancelled one still holds it, as rq).
    ``enqueue_at_front`` is accepted and recorded; a released dependent starts where the
    worker that waited for it already holds it, so it has no queue position to take.
    """

    def __init__(
        self,
        jobs: Job | str | Sequence[Job | str] | Any,
        allow_failure: bool = False,
        enqueue_at_front: bool = False,
    ) -> None:
        items = [jobs] if isinstance(jobs, str) or not isinstance(jobs, Sequence) else list(jobs)
        if not items:
            raise ValueError("jobs: cannot be empty.")
        for item in items:
            if not isinstance(item, str) and not isinstance(getattr(item, "id", None), str):
                raise ValueError(f"jobs: must contain objects of type Job and/or strings, {item!r}")
        self.dependencies = items
        self.allow_failure = allow_failure
        self.enqueue_at_front = enqueue_at_front

    def __repr__(self) -> str:
        return f"Dependency({self.dependencies!r}, allow_failure={self.allow_failure})"


class job:
    """rq's ``@job(queue, connection=..., **enqueue options)``: ``f.delay(*args)`` (or rq 3's
    ``f.enqueue(*args)``) enqueues.

    ``queue`` is a runfleet ``Queue`` or a queue name (then ``connection`` is a ``Queue``
    whose settings it uses). Calling ``f`` directly still runs it here, as in rq.
    """

    def __init__(self, queue: Queue | str, connection: Queue | None = None, **options: Any):
        self.queue = queue
        self.connection = connection
        self.options = options

    def __call__(self, f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def delay(*args: Any, **kwargs: Any) -> Job:
            from runfleet.broker.sync import Queue

            queue = self.queue
            if isinstance(queue, str):
                if self.connection is None:
                    raise InvalidInput("connection", "a queue name needs connection=<Queue>")
                queue = Queue(queue, connection=self.connection)
            return queue.enqueue(f, *args, **self.options, **kwargs)

        f.delay = delay  # type: ignore[attr-defined]  # rq's @job adds .delay to the decorated function
        f.enqueue = delay  # type: ignore[attr-defined]  # rq 3's name for .delay
        return f


def cancel_job(job_id: str, connection: Queue, enqueue_dependents: bool = False) -> None:
    """rq's ``cancel_job``."""
    from runfleet.broker.jobs import Job

    Job.fetch(job_id, connection=connection).cancel(enqueue_dependents=enqueue_dependents)


def send_stop_job_command(connection: Queue, job_id: str, serializer: Any = None) -> None:
    """rq's ``send_stop_job_command``: stop a job that is executing now.

    NoSuchJobError for an unknown id, InvalidJobOperation (rq's) unless it is executing.
    The run is cancelled durably (its worker interrupts the body at once, ``on_stopped``
    runs) and reads ``stopped``.
    """
    from runfleet.broker.jobs import Job, JobStatus

    job = Job.fetch(job_id, connection=connection)
    if job.get_status() is not JobStatus.STARTED:
        raise InvalidJobOperation("Job is not currently executing")
    run_id = job._current.id
    connection._rq.mark("stopped", [run_id])
    connection.cancel(run_id, actor="stop-job")


def requeue_job(job_id: str, connection: Queue) -> Job:
    """rq's ``requeue_job``."""
    from runfleet.broker.jobs import Job

    return Job.fetch(job_id, connection=connection).requeue()
