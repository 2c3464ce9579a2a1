"""Redis: wake-up streams, liveness keys and notifications, plus the producer API."""

from runfleet.broker.admission import Callback, Retry
from runfleet.broker.current import get_current_job
from runfleet.broker.jobs import Job, JobStatus, NoSuchJobError, Result
from runfleet.broker.queue import AsyncQueue, EnqueueSpec
from runfleet.broker.registries import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from runfleet.broker.rq_api import (
    Dependency,
    DuplicateJobError,
    InvalidJobOperation,
    JobTimeoutException,
    cancel_job,
    job,
    requeue_job,
    send_stop_job_command,
)
from runfleet.broker.run import AsyncRun, RunCancelled, RunDead, RunFailed
from runfleet.broker.sync import Queue, Run
from runfleet.store.errors import RunNotFound
from runfleet.store.types import (
    EventAnswer,
    EventCompleted,
    EventExisting,
    EventRunSettled,
    EventTimedOut,
)

__all__ = [
    "AsyncQueue",
    "AsyncRun",
    "Callback",
    "CanceledJobRegistry",
    "DeferredJobRegistry",
    "Dependency",
    "DuplicateJobError",
    "EnqueueSpec",
    "EventAnswer",
    "EventCompleted",
    "EventExisting",
    "EventRunSettled",
    "EventTimedOut",
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
    "RunCancelled",
    "RunDead",
    "RunFailed",
    "RunNotFound",
    "ScheduledJobRegistry",
    "StartedJobRegistry",
    "cancel_job",
    "get_current_job",
    "job",
    "requeue_job",
    "send_stop_job_command",
]
