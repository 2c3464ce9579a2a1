"""``Queue``: the synchronous, rq-shaped face of ``AsyncQueue``; its runs are ``Job``s.

Producers are often synchronous web apps. Rather than a second implementation,
each ``Queue`` drives an ``AsyncQueue`` on a private event loop in a daemon
thread; every method is the async one, called and waited for.

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
from collections.abc import Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from runfleet.broker.jobs import FailedJobRegistry, Job, JobStatus, NoSuchJobError
from runfleet.broker.queue import AsyncQueue, EnqueueSpec
from runfleet.broker.run import AsyncRun
from runfleet.store.config import Settings
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
        if threading.current_thread() is self.thread:  # collected on our own loop
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


class Queue:
    """Enqueue runs from synchronous code, as with ``rq.Queue``."""

    def __init__(
        self,
        name: str = "default",
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        scopes: Iterable[str] = (),
        late_binding: bool = False,
    ) -> None:
        self._async = AsyncQueue(
            name,
            settings=settings,
            database_url=database_url,
            redis_url=redis_url,
            scopes=scopes,
            late_binding=late_binding,
        )
        self.name = name
        self._driver = _Driver(self._async)
        self._finalizer = weakref.finalize(self, self._driver.shutdown)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._driver.call(coro)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    def _wrap(self, run: AsyncRun) -> Job:
        return Job(self, run.id)

    # ---- admission (rq's keyword arguments: see AsyncQueue.enqueue) ---------

    def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        return self._wrap(self._call(self._async.enqueue(f, *args, **kwargs)))

    def enqueue_call(
        self,
        func: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """rq's ``enqueue_call``: arguments as a tuple and a dict, options as keywords."""
        return self._wrap(self._call(self._async.enqueue_call(func, args, kwargs, **options)))

    def enqueue_at(self, when: datetime, f: Any, *args: Any, **kwargs: Any) -> Job:
        return self._wrap(self._call(self._async.enqueue_at(when, f, *args, **kwargs)))

    def enqueue_in(self, delay: timedelta, f: Any, *args: Any, **kwargs: Any) -> Job:
        return self._wrap(self._call(self._async.enqueue_in(delay, f, *args, **kwargs)))

    def enqueue_many(self, specs: Sequence[EnqueueSpec]) -> list[Job]:
        return [self._wrap(r) for r in self._call(self._async.enqueue_many(specs))]

    prepare_data = staticmethod(AsyncQueue.prepare_data)

    # ---- rq's queue reads -----------------------------------------------------

    def fetch(self, run_id: str) -> Job:
        """A handle on ``run_id`` without reading it (runfleet's; rq's is ``fetch_job``)."""
        return Job(self, run_id)

    def fetch_job(self, job_id: str) -> Job | None:
        """rq's ``fetch_job``: the job, or None when no such run exists."""
        try:
            return Job.fetch(job_id, connection=self)
        except NoSuchJobError:
            return None

    @property
    def job_ids(self) -> list[str]:
        """Ids of the runs waiting in this queue to be started, oldest first (rq's list)."""
        return self.get_job_ids()

    def get_job_ids(self, offset: int = 0, length: int = -1) -> list[str]:
        ids = self._call(self._async.queued_ids())
        return ids[offset:] if length < 0 else ids[offset : offset + length]

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
        """rq's ``empty``: drop every queued run (each is durably cancelled); how many."""
        ids = self.job_ids
        for job_id in ids:
            self.cancel(job_id, actor="queue.empty")
        return len(ids)

    @property
    def failed_job_registry(self) -> FailedJobRegistry:
        return FailedJobRegistry(self)

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
