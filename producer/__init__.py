"""The native producer: ``AsyncQueue`` admits runs, ``AsyncRun`` reads and waits for one.

Admission (``producer.admission``) reads a flow's declaration (``runfleet.declaration``)
and checks arguments before any write; the calls on an existing run are collaborators over
one session (``producer.session``): control, messages, history. rq's face over it is
``runfleet.rqface`` (the synchronous ``Queue`` and its ``Job``).
"""

from runfleet.producer.admission import Callback, EnqueueSpec, Retry
from runfleet.producer.queue import AsyncQueue
from runfleet.producer.run import AsyncRun, RunCancelled, RunDead, RunFailed
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
    "Retry",
    "RunCancelled",
    "RunDead",
    "RunFailed",
    "RunNotFound",
]
