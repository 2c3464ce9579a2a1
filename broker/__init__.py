"""Redis: wake-up streams, liveness keys and notifications, plus the producer API."""

from runfleet.broker.admission import Callback, Retry
from runfleet.broker.jobs import FailedJobRegistry, Job, JobStatus, NoSuchJobError
from runfleet.broker.queue import AsyncQueue, EnqueueSpec
from runfleet.broker.run import AsyncRun, RunCancelled, RunFailed
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
    "EnqueueSpec",
    "EventAnswer",
    "EventCompleted",
    "EventExisting",
    "EventRunSettled",
    "EventTimedOut",
    "FailedJobRegistry",
    "Job",
    "JobStatus",
    "NoSuchJobError",
    "Queue",
    "Retry",
    "Run",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
]
