"""Flows the seed-rule tests drive (registered on import, in-process workers only)."""

from __future__ import annotations

import asyncio
from typing import Any

from runfleet.worker import Context, Handoff, flow

UNDONE: list[str] = []
"""Compensations that ran, in order (in-process workers only)."""

STARTED: list[str] = []
"""Run ids whose body began, written by user code before any durable call (in-process)."""

STOPPED: list[str] = []
"""Run ids whose body was cancelled mid-way (``sr.holds``; in-process workers only)."""


def undo(output: Any) -> None:
    UNDONE.append(str(output))


@flow(name="sr.compensating_child")
async def compensating_child(ctx: Context, tag: str) -> None:
    await ctx.step("one", str, f"{tag}-1", compensate=undo)
    await ctx.step("two", str, f"{tag}-2", compensate=undo)
    await ctx.wait_for("never")


@flow(name="sr.parent_of_compensating")
async def parent_of_compensating(ctx: Context, tag: str) -> Any:
    return await ctx.child(compensating_child, tag)


@flow(name="sr.lineage", max_rounds=10)
async def lineage(ctx: Context, n: int) -> Any:
    if n > 0:
        return Handoff(lineage, (n - 1,))
    await ctx.wait_for("go")
    return "done"


@flow(name="sr.big_budget", max_rounds=50)
async def big_budget(ctx: Context, n: int) -> Any:
    return Handoff(big_budget, (n + 1,))


@flow(name="sr.timed", timeout=30)
async def timed(ctx: Context) -> str:
    await ctx.wait_for("go")
    return "done"


@flow(name="sr.waiter")
async def waiter(ctx: Context) -> str:
    await ctx.wait_for("go")
    return "done"


@flow(name="sr.marks_start")
async def marks_start(ctx: Context) -> str:
    """User code with a side effect before any durable call: a body that began is seen."""
    STARTED.append(ctx.run_id)
    await ctx.wait_for("go")
    return "done"


@flow(name="sr.holds")
async def holds(ctx: Context) -> str:
    """Runs until something stops it (no durable call to notice a lapse by itself)."""
    STARTED.append(ctx.run_id)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        STOPPED.append(ctx.run_id)
        raise
    return "never"
