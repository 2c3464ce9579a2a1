"""rq's vocabulary beneath its ``Job`` and ``Queue``: ``Dependency``, the exceptions, the
default job timeout, the refusal of ``pipeline=``; rq's job-id rule is the producer's
(``producer.job_ids``). The calls that need a ``Queue`` (``@job``, ``cancel_job``,
``requeue_job``, ``send_stop_job_command``) are ``rqface.commands``.
"""

from __future__ import annotations

from collections.abc import Sequence

from runfleet.producer.job_ids import DuplicateJobError, JobIdTypeError, rq_job_id
from runfleet.store.errors import InvalidInput, RunfleetError


class InvalidJobOperation(RunfleetError):
    """rq's ``InvalidJobOperation``: cancelling a cancelled job, requeueing one that did
    not fail."""


DEFAULT_JOB_TIMEOUT = 180
"""rq's default ``job_timeout`` in seconds: a plain function enqueued without one (nor a
queue ``default_timeout``) fails with ``JobTimeoutException`` past it."""


class JobTimeoutException(Exception):
    """rq's ``JobTimeoutException``: a job ran past its ``job_timeout``; the job fails with
    it (in ``exc_info`` and the failed registry), as in rq."""


def refuse_pipeline(pipeline: object) -> None:
    """rq's ``pipeline=``: runfleet's calls are Postgres transactions, not a Redis pipeline
    to join, so one passed is refused rather than silently ignored."""
    if pipeline is not None:
        raise InvalidInput("pipeline", "rq's pipeline= is not supported (docs/moving-from-rq.md)")


class Dependency:
    """rq's ``Dependency(jobs, allow_failure=False, enqueue_at_front=False)``.

    ``jobs``: a job, an id, or a list of them. ``allow_failure``: the dependent runs once
    every dependency ended, completed or failed (a cancelled one still holds it, as rq).
    ``enqueue_at_front`` is accepted and recorded; a released dependent starts where the
    worker that waited for it already holds it, so it has no queue position to take.
    """

    def __init__(
        self,
        jobs: object,
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


__all__ = [
    "DEFAULT_JOB_TIMEOUT",
    "Dependency",
    "DuplicateJobError",
    "InvalidJobOperation",
    "JobIdTypeError",
    "JobTimeoutException",
    "refuse_pipeline",
    "rq_job_id",
]
