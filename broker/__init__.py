"""Redis: wake-up streams, liveness keys and notifications, plus the producer API."""

from broker.admission import Callback, Retry
from broker.jobs import FailedJobRegistry, Job, JobStatus, NoSuchJobError
from broker.queue import AsyncQueue, EnqueueSpec
from broker.run import AsyncRun, RunCancelled, RunFailed
from broker.sync import Queue, Run
from store.errors import RunNotFound
from store.types import EventAnswer, EventCompleted, EventExisting, EventRunSettled, EventTimedOut

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
