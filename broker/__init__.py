"""Redis: wake-up streams, liveness keys and notifications, plus the producer API."""

from broker.queue import AsyncQueue, AsyncRun, EnqueueSpec, RunCancelled, RunFailed, RunNotFound
from broker.sync import Queue, Run

__all__ = [
    "AsyncQueue",
    "AsyncRun",
    "EnqueueSpec",
    "Queue",
    "Run",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
]
