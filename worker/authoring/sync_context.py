"""The Context API for plain ``def`` flows, which run in a thread.

Each durable call is the async one, run on the worker's event loop and waited
for; cancellation reaches a sync body at its next durable call. Its bookkeeping is
retried there too (``Context._durable``): an outage that lapses the lease surfaces in
the thread as ``Interrupted``, never as the database's error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

import runfleet.worker.tracing as tracing
from runfleet.worker.authoring.context import Context
from runfleet.worker.authoring.durable import Decision, Retry

T = TypeVar("T")
INTERRUPT_POLL_S = 0.05
"""How often a thread waiting on a durable call looks for an interrupt."""


class SyncContext:
    def __init__(self, ctx: Context, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.log = ctx.log

    @property
    def run_id(self) -> str:
        return self._ctx.run_id

    @property
    def epoch(self) -> int:
        return self._ctx.epoch

    @property
    def interrupted(self) -> str | None:
        return self._ctx.interrupted

    def check(self) -> None:
        self._ctx.check()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a durable call on the loop; an interrupt while it waits cancels it.

        The driver's interrupt cancels the body's task, not a call this thread
        submitted, and that call may be waiting out an outage (retrying, or waiting for
        a connection): left alone, the thread would outlive the lease.
        """
        if self._ctx.interrupted is not None:
            coro.close()
            self._ctx.check()
        future = asyncio.run_coroutine_threadsafe(tracing.bind(coro), self._loop)
        while not concurrent.futures.wait([future], timeout=INTERRUPT_POLL_S).done:
            if self._ctx.interrupted is not None:
                future.cancel()
                self._ctx.check()
        return future.result()

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | None = None,
        compensate: Callable[..., Any] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        return self._call(
            self._ctx.step(
                name, fn, *args, retry=retry, compensate=compensate, timeout=timeout, **kwargs
            )
        )

    def sleep(self, duration: timedelta | float) -> None:
        self._call(self._ctx.sleep(duration))

    def sleep_until(self, when: datetime) -> None:
        self._call(self._ctx.sleep_until(when))

    def wait_for(self, name: str, timeout: float | None = None) -> Any:
        return self._call(self._ctx.wait_for(name, timeout))

    def approval(
        self,
        name: str,
        request: Any = None,
        timeout: float | None = None,
        *,
        on_token: Callable[[str], Any] | None = None,
    ) -> Decision:
        return self._call(self._ctx.approval(name, request, timeout, on_token=on_token))

    def patched(self, patch_id: str) -> bool:
        return self._call(self._ctx.patched(patch_id))

    def set_event(self, key: str, value: Any) -> None:
        self._call(self._ctx.set_event(key, value))

    def recv(self, topic: str, timeout: float | None = None) -> Any:
        return self._call(self._ctx.recv(topic, timeout))

    def send(self, run_id: str, topic: str, value: Any = None) -> bool:
        return self._call(self._ctx.send(run_id, topic, value))

    def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        return self._call(self._ctx.get_event(run_id, key, timeout))

    def quota(self, wake_at: datetime | int) -> None:
        self._call(self._ctx.quota(wake_at))

    def child(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> Any:
        return self._call(self._ctx.child(flow, *args, run_id=run_id, **kwargs))

    def spawn(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> str:
        return self._call(self._ctx.spawn(flow, *args, run_id=run_id, **kwargs))
