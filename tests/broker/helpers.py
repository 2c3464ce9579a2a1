"""Waiting on conditions with a deadline, never on a sleep that hopes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    *,
    within: float = 5.0,
    every: float = 0.02,
) -> T:
    """Call ``check`` until ``accept`` holds for its answer; at the deadline, fail showing it."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if accept(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {within}s; last value: {value!r}")
        await asyncio.sleep(every)


async def acl(redis: Redis, *args: str) -> None:
    """Run an ACL command (redis-py leaves ``execute_command`` untyped)."""
    await redis.execute_command("ACL", *args)  # type: ignore[no-untyped-call]
