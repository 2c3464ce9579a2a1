"""rq's module-level calls that need a ``Queue``: the ``@job`` decorator, ``cancel_job``,
``requeue_job`` and ``send_stop_job_command``.

Each one is rq's signature with rq's meaning; ``connection`` is a runfleet ``Queue`` where
rq takes a Redis client (the one-line change the README's mapping table names).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from runfleet.rqface.jobs import Job, JobStatus
from runfleet.rqface.rq_api import InvalidJobOperation
from runfleet.rqface.sync import Queue
from runfleet.store.errors import InvalidInput


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
    Job.fetch(job_id, connection=connection).cancel(enqueue_dependents=enqueue_dependents)


def send_stop_job_command(connection: Queue, job_id: str, serializer: Any = None) -> None:
    """rq's ``send_stop_job_command``: stop a job that is executing now.

    NoSuchJobError for an unknown id, InvalidJobOperation (rq's) unless it is executing.
    The run is cancelled durably (its worker interrupts the body at once, ``on_stopped``
    runs) and reads ``stopped``.
    """
    job = Job.fetch(job_id, connection=connection)
    if job.get_status() is not JobStatus.STARTED:
        raise InvalidJobOperation("Job is not currently executing")
    run_id = job._current.id
    connection._rq.mark("stopped", [run_id])
    connection.cancel(run_id, actor="stop-job")


def requeue_job(job_id: str, connection: Queue) -> Job:
    """rq's ``requeue_job``."""
    return Job.fetch(job_id, connection=connection).requeue()
