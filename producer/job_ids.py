"""rq's job ids as a producer admits them: ``job_id=`` by rq's rule, ``unique=True`` refused
for an id in use (``DuplicateJobError``). runfleet's own ``run_id=`` keeps its wider rule
(``producer.trust``)."""

from __future__ import annotations

import re

from runfleet.store.errors import InvalidInput, RunfleetError


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
