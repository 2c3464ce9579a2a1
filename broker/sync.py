"""``Queue`` and ``Run``: the synchronous, rq-shaped face of ``AsyncQueue``.

Producers are often synchronous web apps. Rather than a second implementation,
each ``Queue`` drives an ``AsyncQueue`` on a private event loop in a daemon
thread; every method is the async one, called and waited for.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from broker.queue import AsyncQueue, AsyncRun, EnqueueSpec
from store.config import Settings
from store.types import CancelOutcome, RunStatus

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="runfleet-queue"
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class Run:
    """rq's Job, for runfleet: ``id``, ``get_status()``, ``result()``, ``return_value()``."""

    def __init__(self, queue: Queue, inner: AsyncRun) -> None:
        self._queue = queue
        self._inner = inner
        self.id = inner.id

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def get_status(self) -> RunStatus:
        return self._queue._call(self._inner.get_status())

    def result(self, timeout: float = 30.0) -> Any:
        return self._queue._call(self._inner.result(timeout))

    def return_value(self) -> Any:
        return self._queue._call(self._inner.return_value())

    def cancel(self, *, actor: str | None = None) -> CancelOutcome:
        return self._queue._call(self._inner.cancel(actor=actor))


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
        self._thread = _LoopThread()
        self._lock = threading.Lock()
        self._connected = False

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if not self._connected:
                self._thread.call(self._async.connect())
                self._connected = True
        return self._thread.call(coro)

    def close(self) -> None:
        if self._connected:
            self._thread.call(self._async.close())
            self._connected = False
        self._thread.stop()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wrap(self, run: AsyncRun) -> Run:
        return Run(self, run)

    def enqueue(
        self,
        f: Any,
        *args: Any,
        run_id: str | None = None,
        job_id: str | None = None,
        **kwargs: Any,
    ) -> Run:
        return self._wrap(
            self._call(self._async.enqueue(f, *args, run_id=run_id, job_id=job_id, **kwargs))
        )

    def enqueue_at(
        self, when: datetime, f: Any, *args: Any, run_id: str | None = None, **kwargs: Any
    ) -> Run:
        return self._wrap(
            self._call(self._async.enqueue_at(when, f, *args, run_id=run_id, **kwargs))
        )

    def enqueue_in(
        self, delay: timedelta, f: Any, *args: Any, run_id: str | None = None, **kwargs: Any
    ) -> Run:
        return self._wrap(
            self._call(self._async.enqueue_in(delay, f, *args, run_id=run_id, **kwargs))
        )

    def enqueue_many(self, specs: Sequence[EnqueueSpec]) -> list[Run]:
        return [self._wrap(r) for r in self._call(self._async.enqueue_many(specs))]

    prepare_data = staticmethod(AsyncQueue.prepare_data)

    def fetch(self, run_id: str) -> Run:
        return self._wrap(self._async.run(run_id))

    def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome:
        return self._call(self._async.cancel(run_id, actor=actor))

    def complete(self, run_id: str, name: str, value: Any = None) -> bool:
        return self._call(self._async.complete(run_id, name, value))

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
