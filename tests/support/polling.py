"""Waiting on a condition with a deadline, never on a sleep that hopes (STYLE rule 9).

One loop for the whole suite: call ``check``, return its answer as soon as ``accept`` holds
for it, and at the deadline fail loudly with what was awaited and the last answer seen, so
a timed-out test says why. ``until`` is for async checks (the store, Redis, a worker's
rows); ``until_sync`` is the same rule for code that blocks (the rq-style ``Queue``, whose
callers poll ``job.is_finished`` the way rq's documentation does).

The failure is a ``TimeoutError`` (some scenarios catch it to add the logs they hold).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_EVERY_S = 0.02


class _Deadline:
    """When to give up, and the error that says what was awaited and what was last seen."""

    def __init__(self, timeout: float, what: str) -> None:
        self.timeout = timeout
        self.what = what
        self._at = time.monotonic() + timeout

    def check(self, last: object) -> None:
        if time.monotonic() >= self._at:
            raise TimeoutError(
                f"timed out after {self.timeout}s waiting for {self.what}; last value {last!r}"
            )


@overload
async def until(
    check: Callable[[], Awaitable[T | bool | None]],
    timeout: float = ...,
    what: str = ...,
    *,
    every: float = ...,
) -> T: ...


@overload
async def until(
    check: Callable[[], Awaitable[T]],
    timeout: float = ...,
    what: str = ...,
    *,
    accept: Callable[[T], object],
    every: float = ...,
) -> T: ...


async def until(
    check: Callable[[], Awaitable[object]],
    timeout: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    *,
    accept: Callable[[Any], object] = bool,
    every: float = DEFAULT_EVERY_S,
) -> object:
    """Await ``check`` until ``accept`` holds for its answer (default: the answer is truthy)."""
    deadline = _Deadline(timeout, what)
    while True:
        value = await check()
        if accept(value):
            return value
        deadline.check(value)
        await asyncio.sleep(every)


@overload
def until_sync(
    check: Callable[[], T | bool | None],
    timeout: float = ...,
    what: str = ...,
    *,
    every: float = ...,
) -> T: ...


@overload
def until_sync(
    check: Callable[[], T],
    timeout: float = ...,
    what: str = ...,
    *,
    accept: Callable[[T], object],
    every: float = ...,
) -> T: ...


def until_sync(
    check: Callable[[], object],
    timeout: float = DEFAULT_TIMEOUT_S,
    what: str = "the condition",
    *,
    accept: Callable[[Any], object] = bool,
    every: float = DEFAULT_EVERY_S,
) -> object:
    """``until`` for blocking checks: the same rule, sleeping the thread between calls."""
    deadline = _Deadline(timeout, what)
    while True:
        value = check()
        if accept(value):
            return value
        deadline.check(value)
        time.sleep(every)
