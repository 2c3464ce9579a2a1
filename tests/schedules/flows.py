"""Flows the schedule tests run in real worker processes (``--flows tests.schedules.flows``)."""

from __future__ import annotations

import asyncio
import os

from runfleet.worker import Context, flow


@flow(name="sched.noop")
async def noop(ctx: Context) -> int:
    return os.getpid()


@flow(name="sched.slow")
async def slow(ctx: Context, seconds: float = 2.5) -> int:
    """Outlasts its one-second period: the next ticks find it open (overlap policy)."""
    await asyncio.sleep(seconds)
    return os.getpid()
