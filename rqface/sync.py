"""``Queue``: the synchronous, rq-shaped face of ``AsyncQueue``; its runs are ``Job``s.

Producers are often synchronous web apps. Rather than a second implementation, every
method is the ``AsyncQueue`` one, called in one of two ways:

- the calls that are one statement and never wait (an enqueue, the read of a run) are
  driven in the caller's own thread over a blocking pool and a blocking Redis client
  (``store.inline.drive``: the same coroutine, which never suspends there), so a call
  costs its statement and no thread hop;
- the rest (waiting for a result, batches, the registry reads) run on a private event
  loop in a daemon thread, called and waited for.

A cluster Redis URL takes the loop for every call (the blocking client is a plain one).

A queue left open is closed for its owner: when it is garbage-collected, or at
interpreter exit (``weakref.finalize``), its pool and Redis client are closed on
their loop and the loop's remaining tasks are cancelled and awaited before the
loop stops — otherwise asyncio prints "Task was destroyed but it is pending!"
for every pool worker when the daemon thread dies with the loop still holding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from runfleet.broker.blocking import BlockingRedis
from runfleet.broker.client import cluster_url
from runfleet.broker.notify import SettledMark
from runfleet.producer.admission import split_rq_call
from runfleet.producer.queue import AsyncQueue, EnqueueSpec, _chosen_id
from runfleet.producer.run import AsyncRun
from runfleet.rqface.in_process import run_inline
from runfleet.rqface.jobs import Job, JobStatus, NoSuchJobError
from runfleet.rqface.registries import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from runfleet.rqface.rq_api import DEFAULT_JOB_TIMEOUT, refuse_pipeline
from runfleet.rqface.rq_queue import RqReads
from runfleet.store import inline
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.events import SendOutcome
from runfleet.store.forks import Deleted
from runfleet.store.queues import QueueSettings
from runfleet.store.steps import StepEntry
from runfleet.store.types import CancelOutcome, EventAnswer

T = TypeVar("T")

Run = Job
"""The sync run handle's earlier name; same class."""

__all__ = ["Job", "JobStatus", "NoSuchJobError", "Queue", "Run"]

_CLOSE_TIMEOUT = 10.0


class _Driver:
    """The loop thread, the AsyncQueue it drives, and its one-time shutdown.

    Holds no reference to the ``Queue``, so a finalizer can own it.
    """

    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue
        self.loop = asyncio.new_event_loop()
        self.connected = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="runfleet-queue"
        )
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("the queue is closed")
        with self.lock:
            if not self.connected:
                asyncio.run_coroutine_threadsafe(self.queue.connect(), self.loop).result()
                self.connected = True
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _close(self) -> None:
        """Close the queue, then cancel and await whatever else still runs on the loop."""
        if self.connected:
            self.connected = False
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.queue.close(), _CLOSE_TIMEOUT)
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks(self.loop) if t is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.loop.shutdown_asyncgens()

    def shutdown(self) -> None:
        if self.loop.is_closed():
            return
        if threading.current_thread() is self.thread:  # collected on its own loop
            task = self.loop.create_task(self._close())
            task.add_done_callback(lambda _t: self.loop.stop())
            return
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(
                    _CLOSE_TIMEOUT + 5
                )
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class _Inline:
    """The ``AsyncQueue`` whose calls are driven in the caller's thread, opened at first use.

    Holds no reference to the ``Queue``, so a finalizer can own it.
    """

    def __init__(self, make: Callable[[], AsyncQueue], settings: Settings) -> None:
        self._make = make
        self._settings = settings
        self._queue: AsyncQueue | None = None
        self._lock = threading.Lock()
        self.usable = cluster_url(settings.redis_url) is None

    def queue(self) -> AsyncQueue:
        if self._queue is None:
            with self._lock:
                if self._queue is None:
                    queue = self._make()
                    budget = self._settings.producer_retry_for
                    store = inline.open_store(
                        queue.settings, checkout_timeout=max(0.5, min(2.0, budget))
                    )
                    redis = BlockingRedis.for_settings(queue.settings)
                    queue._attach(
                        store=store,
                        redis=redis,  # type: ignore[arg-type]  # the awaitable subset it uses
                        group_commit=False,
                        unanswered=redis.unanswered,
                    )
                    self._queue = queue
        return self._queue

    def shutdown(self) -> None:
        self.usable = False  # a closed Queue's calls fail on its closed loop, as before
        queue, self._queue = self._queue, None
        if queue is not None:
            store, redis = queue.session.detach()
            if store is not None:
                inline.close_store(store)
            if isinstance(redis, BlockingRedis):
                redis.close()


def _shutdown(driver: _Driver, blocking: _Inline) -> None:
    blocking.shutdown()
    driver.shutdown()


class Queue:
    """Enqueue runs from synchronous code, as with ``rq.Queue``."""

    DEFAULT_TIMEOUT = DEFAULT_JOB_TIMEOUT
    """rq's ``Queue.DEFAULT_TIMEOUT``: a plain function's job timeout when none is given."""

    def __init__(
        self,
        name: str = "default",
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        scopes: Iterable[str] = (),
        late_binding: bool = False,
        connection: Queue | None = None,
        is_async: bool = True,
        job_class: Any = None,
        serializer: Any = None,
        default_timeout: Any = None,
    ) -> None:
        """``connection``: another runfleet ``Queue`` whose settings, URLs, scopes and
        late binding this one takes (rq's ``connection=Redis(...)``). ``is_async=False``:
        ``enqueue`` runs the function here, not durably (rqface/in_process.py).
        ``job_class`` and ``serializer`` are rq's; only their defaults are taken."""
        if job_class is not None or serializer is not None:
            raise InvalidInput(
                "serializer" if serializer is not None else "job_class",
                "runfleet stores JSON and answers runfleet.rqface.Job: rq's job_class=/serializer= "
                "have no runfleet meaning (docs/how-to/moving-from-rq.md)",
            )
        if connection is not None:
            if not isinstance(connection, Queue):
                raise InvalidInput("connection", "a runfleet Queue (rq's was a Redis client)")
            base = connection._async
            settings = settings or base.settings
            scopes = scopes or base.scopes
            late_binding = late_binding or base.late_binding
        scopes = tuple(scopes)  # read twice: by this queue and by its blocking twin
        self._async: AsyncQueue = AsyncQueue(
            name,
            settings=settings,
            database_url=database_url,
            redis_url=redis_url,
            scopes=scopes,
            late_binding=late_binding,
            default_timeout=default_timeout,
        )
        self.name: str = name
        self.is_async = is_async
        self._driver = _Driver(self._async)

        resolved = self._async.settings

        def twin() -> AsyncQueue:  # no reference to self: the finalizer owns _inline
            return AsyncQueue(
                name,
                settings=resolved,
                scopes=scopes,
                late_binding=late_binding,
                default_timeout=default_timeout,
            )

        self._inline = _Inline(twin, resolved)
        self._finalizer = weakref.finalize(self, _shutdown, self._driver, self._inline)
        self._rq = RqReads(self._async, self._call)

    def sibling(self, name: str) -> Queue:
        """The queue called ``name`` on this one's settings (rq's ``Queue(name, connection=)``)."""
        return Queue(name, connection=self)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` (of the loop's queue, ``_async``) on the loop thread, waited for."""
        return self._driver.call(coro)

    def _settled_shared(self) -> bool:
        """Whether the loop thread's shared settled subscription is up (``Job.wait``)."""
        return self._driver.connected and self._async.notifier.settled_shared(self._driver.loop)

    def _now(self, call: Callable[[AsyncQueue], Coroutine[Any, Any, T]]) -> T:
        """A call that is one statement and never waits, driven in this thread.

        ``call`` gets the queue to call: the blocking twin, or the loop's where the twin
        is unusable (a cluster Redis URL).
        """
        if not self._inline.usable:
            return self._call(call(self._async))
        return inline.drive(call(self._inline.queue()))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    def __str__(self) -> str:
        return f"<Queue {self.name}>"

    @property
    def settings_key(self) -> tuple[str, str, str]:
        """What makes two queues the same store (rq compares queues by name and Redis)."""
        s = self._async.settings
        return (s.database_url, s.redis_url, s.redis_prefix)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Queue):
            raise TypeError("Cannot compare queues to other objects")
        return self.name == other.name and self.settings_key == other.settings_key

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Queue):
            raise TypeError("Cannot compare queues to other objects")
        return self.name < other.name

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Queue):
            raise TypeError("Cannot compare queues to other objects")
        return self.name > other.name

    def __hash__(self) -> int:
        return hash(self.name)

    def _wrap(self, run: AsyncRun, mark: SettledMark | None = None) -> Job:
        return Job(self, run.id, settled_mark=mark if run.created else None)

    def _admitted(self, call: Callable[[AsyncQueue], Coroutine[Any, Any, AsyncRun]]) -> Job:
        """One admission driven in this thread (``_now``), its job handed the loop's settled
        subscription's mark from before the commit (``SettledMark``: its ``wait`` needs
        no read before the run's notice)."""
        mark = (
            self._async.notifier.settled_mark(self._driver.loop) if self._driver.connected else None
        )
        return self._wrap(self._now(call), mark)

    # ---- admission (rq's keyword arguments: see AsyncQueue.enqueue) ---------

    def enqueue(self, f: Any, /, *args: Any, **kwargs: Any) -> Job:
        if not self.is_async:
            run_id, job_id = kwargs.pop("run_id", None), kwargs.pop("job_id", None)
            call = split_rq_call(args, kwargs)
            spec = EnqueueSpec(f, call.args, call.kwargs, _chosen_id(run_id, job_id), call.options)
            return run_inline(self, self._call(self._async._new_run(spec, inline=True)))
        return self._admitted(lambda q: q.enqueue(f, *args, **kwargs))

    def enqueue_call(
        self,
        func: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """rq's ``enqueue_call``: arguments as a tuple and a dict, options as keywords."""
        if not self.is_async:  # run here, as enqueue does (rq's enqueue_job too)
            return self.enqueue(func, args=args, kwargs=kwargs, **options)
        return self._admitted(lambda q: q.enqueue_call(func, args, kwargs, **options))

    def enqueue_job(self, job: Job, pipeline: Any = None, at_front: bool = False) -> Job:
        """rq's ``enqueue_job``: admit a job made by ``Job.create`` on this queue."""
        refuse_pipeline(pipeline)
        created = job._created
        if created is None:
            raise InvalidInput("job", f"{job.id} was not made by Job.create or is enqueued already")
        options = dict(created.options)
        if at_front:
            options["at_front"] = True
        enqueued = self.enqueue_call(
            created.func, created.args, created.kwargs, job_id=job.id, **options
        )
        job._created = None
        job._row = None
        return enqueued

    def enqueue_at(self, when: datetime, f: Any, /, *args: Any, **kwargs: Any) -> Job:
        return self._admitted(lambda q: q.enqueue_at(when, f, *args, **kwargs))

    def enqueue_in(self, delay: timedelta, f: Any, /, *args: Any, **kwargs: Any) -> Job:
        return self._admitted(lambda q: q.enqueue_in(delay, f, *args, **kwargs))

    def enqueue_many(self, specs: Sequence[EnqueueSpec]) -> list[Job]:
        return [self._wrap(r) for r in self._call(self._async.enqueue_many(specs))]

    prepare_data = staticmethod(AsyncQueue.prepare_data)

    # ---- rq's queue reads -----------------------------------------------------

    def fetch(self, run_id: str) -> Job:
        """A handle on ``run_id`` without reading it (runfleet's; rq's is ``fetch_job``)."""
        return Job(self, run_id)

    def fetch_job(self, job_id: str) -> Job | None:
        """rq's ``fetch_job``: the job if it is one of this queue's, else None."""
        try:
            job = Job.fetch(job_id, connection=self)
        except NoSuchJobError:
            return None
        return job if job.origin == self.name else None

    @property
    def job_ids(self) -> list[str]:
        """Ids of the runs waiting in this queue to be started (rq's list): ``at_front``
        ones first (newest first among them, as rq pushes each to the front), then the
        rest oldest first."""
        return self.get_job_ids()

    def get_job_ids(self, offset: int = 0, length: int = -1) -> list[str]:
        ids = self._rq.queued()
        return ids[offset:] if length < 0 else ids[offset : offset + length]

    def get_jobs(self, offset: int = 0, length: int = -1) -> list[Job]:
        """rq's ``get_jobs``: the queued jobs, fetched."""
        found = Job.fetch_many(self.get_job_ids(offset, length), connection=self)
        return [j for j in found if j is not None]

    def get_job_position(self, job_or_id: Job | str) -> int | None:
        """rq's ``get_job_position``: the index in ``job_ids``, None if not queued."""
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        ids = self.job_ids
        return ids.index(job_id) if job_id in ids else None

    def remove(self, job_or_id: Job | str, pipeline: Any = None) -> int:
        """rq's ``remove``: take the job out of the queue, so it never runs (durably
        cancelled; rq leaves the job's hash behind, here the run reads ``canceled``)."""
        refuse_pipeline(pipeline)
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        if job_id not in self.job_ids:
            return 0
        self.cancel(Job.fetch(job_id, connection=self)._current.id, actor="queue.remove")
        return 1

    def delete(self, delete_jobs: bool = True) -> None:
        """rq's ``Queue.delete``: the queued jobs leave it (durably cancelled; with
        ``delete_jobs`` also deleted for rq's reads) and ``Queue.all`` stops listing it
        until a run is enqueued on it again."""
        ids = [Job.fetch(i, connection=self)._current.id for i in self.job_ids]
        for run_id in ids:
            self.cancel(run_id, actor="queue.delete")
        if delete_jobs:
            self._rq.mark("deleted", ids)
        self._rq.mark_queue_deleted()

    @classmethod
    def all(cls, connection: Queue, job_class: Any = None, serializer: Any = None) -> list[Queue]:
        """rq's ``Queue.all``: every queue a job was enqueued on (in ``connection``'s
        database, among the queues its scopes cover), by name."""
        return [cls(name, connection=connection) for name in connection._rq.queues()]

    @property
    def started_job_registry(self) -> StartedJobRegistry:
        return StartedJobRegistry(queue=self)

    @property
    def finished_job_registry(self) -> FinishedJobRegistry:
        return FinishedJobRegistry(queue=self)

    @property
    def deferred_job_registry(self) -> DeferredJobRegistry:
        return DeferredJobRegistry(queue=self)

    @property
    def scheduled_job_registry(self) -> ScheduledJobRegistry:
        return ScheduledJobRegistry(queue=self)

    @property
    def canceled_job_registry(self) -> CanceledJobRegistry:
        return CanceledJobRegistry(queue=self)

    @property
    def jobs(self) -> list[Job]:
        return [j for j in Job.fetch_many(self.job_ids, connection=self) if j is not None]

    @property
    def count(self) -> int:
        return len(self.job_ids)

    def __len__(self) -> int:
        return self.count

    def is_empty(self) -> bool:
        return self.count == 0

    def empty(self) -> int:
        """rq's ``empty``: delete every queued job (each run is durably cancelled, then
        gone for rq's reads, as rq deletes them); how many."""
        ids = [Job.fetch(i, connection=self)._current.id for i in self.job_ids]
        for run_id in ids:
            self.cancel(run_id, actor="queue.empty")
        self._rq.mark("deleted", ids)
        return len(ids)

    @property
    def failed_job_registry(self) -> FailedJobRegistry:
        return FailedJobRegistry(queue=self)

    # ---- other producer calls ------------------------------------------------

    def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome:
        return self._call(self._async.cancel(run_id, actor=actor))

    def complete(
        self, run_id: str, name: str, value: Any = None, *, actor: str | None = None
    ) -> EventAnswer:
        return self._call(self._async.complete(run_id, name, value, actor=actor))

    def approve(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        self._call(self._async.approve(run_id, token, value, actor=actor, reason=reason))

    def deny(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        self._call(self._async.deny(run_id, token, value, actor=actor, reason=reason))

    def resume(
        self,
        run_id: str,
        *,
        accept_recorded: bool = False,
        rerun_step: str | None = None,
        actor: str | None = None,
    ) -> None:
        self._call(
            self._async.resume(
                run_id, accept_recorded=accept_recorded, rerun_step=rerun_step, actor=actor
            )
        )

    def interrupt_unsafe(self, run_id: str) -> None:
        self._call(self._async.interrupt_unsafe(run_id))

    # ---- events and messages (producer.messages) -------------------------------

    def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        return self._call(self._async.get_event(run_id, key, timeout))

    def configure(
        self,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        default_priority: int | None = None,
        note: str | None = None,
    ) -> QueueSettings:
        """``AsyncQueue.configure``: this queue's limits, from Python."""
        return self._call(
            self._async.configure(
                concurrency=concurrency, rate=rate, default_priority=default_priority, note=note
            )
        )

    def get_events(self, run_id: str) -> dict[str, Any]:
        return self._call(self._async.get_events(run_id))

    def send(
        self, run_id: str, topic: str, value: Any = None, *, message_id: str | None = None
    ) -> SendOutcome:
        return self._call(self._async.send(run_id, topic, value, message_id=message_id))

    # ---- a run's history (producer.history) ------------------------------------

    def list_steps(self, run_id: str) -> list[StepEntry]:
        return self._call(self._async.list_steps(run_id))

    def resume_run(self, run_id: str, *, actor: str | None = None) -> Job:
        return self._wrap(self._call(self._async.resume_run(run_id, actor=actor)))

    def fork(
        self,
        run_id: str,
        from_step: int,
        *,
        new_run_id: str | None = None,
        actor: str | None = None,
    ) -> Job:
        return self._wrap(
            self._call(self._async.fork(run_id, from_step, new_run_id=new_run_id, actor=actor))
        )

    def delete_run(self, run_id: str, *, actor: str | None = None) -> Deleted:
        return self._call(self._async.delete_run(run_id, actor=actor))
