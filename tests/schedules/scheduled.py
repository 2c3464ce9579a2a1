"""A decorated one-second schedule (``--flows tests.schedules.scheduled``): workers
write it at start, every worker's scheduler fires it."""

from __future__ import annotations

import asyncio
import os

from runfleet.worker import Context, flow


@flow(name="sched.every_second", schedule="* * * * * *", timezone="Europe/Paris")
async def every_second(ctx: Context, work_ms: int = 300) -> int:
    """Short work, so some runs are in flight when a worker is SIGKILLed."""
    await asyncio.sleep(work_ms / 1000)
    return os.getpid()
