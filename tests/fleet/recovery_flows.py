"""Flows for the sweep-progress and recovery-first tests (imported with --flows)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runfleet.worker import Context, flow


@flow(name="rec.nap")
async def nap(ctx: Context, ms: int) -> dict[str, Any]:
    await asyncio.sleep(ms / 1000)
    return {"slept": ms, "pid": os.getpid()}


@flow(name="rec.waiter")
async def waiter(ctx: Context) -> Any:
    return await ctx.wait_for("go")
