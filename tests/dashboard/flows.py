"""Flows the dashboard tests watch: one that stays running, one that moves step by step."""

from __future__ import annotations

import asyncio

from runfleet.worker import Context, flow


@flow(name="d.busy")
async def busy(ctx: Context, seconds: float) -> str:
    """Stays running (no park) until it ends or is cancelled."""
    await asyncio.sleep(seconds)
    return "done"


@flow(name="d.ticker")
async def ticker(ctx: Context, n: int, pause: float) -> int:
    """Records ``n`` steps ``pause`` seconds apart: a run a watcher sees move, then settle."""
    total = 0
    for i in range(n):
        total += await ctx.step(f"tick{i}", int, i)
        await asyncio.sleep(pause)
    return total
