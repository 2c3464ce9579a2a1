"""rq's face over the native producer: the synchronous ``Queue``, ``Job``, the registries,
``get_current_job``, ``@job``, ``is_async=False``, and rq's exceptions.

Every name keeps rq's signature and meaning over ``runfleet.producer``; ``connection`` is a
runfleet ``Queue`` where rq takes a Redis client. The worker honours rq's per-job options
when it runs a plain function (worker/rq_compat.py) and hands the running job down
(``rqface.current``); nothing here imports the worker.
"""

from runfleet.producer.admission import Callback, Retry
from runfleet.rqface.commands import cancel_job, job, requeue_job, send_stop_job_command
from runfleet.rqface.current import get_current_job
from runfleet.rqface.jobs import Job, JobStatus, NoSuchJobError, Result
from runfleet.rqface.registries import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from runfleet.rqface.rq_api import (
    Dependency,
    DuplicateJobError,
    InvalidJobOperation,
    JobTimeoutException,
)
from runfleet.rqface.sync import Queue, Run

__all__ = [
    "Callback",
    "CanceledJobRegistry",
    "DeferredJobRegistry",
    "Dependency",
    "DuplicateJobError",
    "FailedJobRegistry",
    "FinishedJobRegistry",
    "InvalidJobOperation",
    "Job",
    "JobStatus",
    "JobTimeoutException",
    "NoSuchJobError",
    "Queue",
    "Result",
    "Retry",
    "Run",
    "ScheduledJobRegistry",
    "StartedJobRegistry",
    "cancel_job",
    "get_current_job",
    "job",
    "requeue_job",
    "send_stop_job_command",
]
