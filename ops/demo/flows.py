"""The demo's flow: a unit of work of a given length (imported by demo workers)."""

from __future__ import annotations

import asyncio
import os

from runfleet.worker import Context, flow


@flow(name="demo.work", queue="demo")
async def work(ctx: Context, ms: int) -> dict[str, int]:
    await asyncio.sleep(ms / 1000)
    return {"ms": ms, "pid": os.getpid()}
