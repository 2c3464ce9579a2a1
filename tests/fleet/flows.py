"""Flows the fleet tests run in real worker processes (imported with --flows)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from worker import Context, flow


def add(a: int, b: int) -> int:
    """A plain function: an rq-style implicit single-step flow."""
    return a + b


@flow(name="tests.sleepy")
async def sleepy(ctx: Context, ms: int, tag: str = "") -> dict[str, Any]:
    await asyncio.sleep(ms / 1000)
    return {"slept": ms, "tag": tag, "pid": os.getpid()}


@flow(name="tests.sync_sleepy")
def sync_sleepy(ctx: Context, ms: int) -> dict[str, Any]:
    time.sleep(ms / 1000)
    return {"slept": ms, "pid": os.getpid()}


@flow(name="tests.boom")
async def boom(ctx: Context, message: str) -> None:
    raise ValueError(message)


@flow(name="tests.unencodable")
async def unencodable(ctx: Context) -> object:
    return {1, 2, 3}


@flow(name="tests.forever")
async def forever(ctx: Context) -> None:
    await asyncio.Event().wait()
