"""Flows whose runs leave rows in every table retention must clear (imported by the tests)."""

from __future__ import annotations

from typing import Any

from runfleet.worker import Context, Handoff, flow


def double(x: int) -> int:
    return 2 * x


@flow(name="retention.leaf")
async def leaf(ctx: Context, x: int) -> int:
    return int(await ctx.step("double", double, x))


@flow(name="retention.full")
async def full(ctx: Context, x: int) -> dict[str, Any]:
    """A step, a durable timer, an attached child awaited and a detached child."""
    y = await ctx.step("double", double, x)
    await ctx.sleep(0.01)
    z = await ctx.child(leaf, y)
    spawned = await ctx.spawn(leaf, x)
    return {"y": y, "z": z, "spawned": spawned}


@flow(name="retention.parent_waits")
async def parent_waits(ctx: Context, x: int) -> str:
    """An attached child awaited and settled, then the parent stays open on an event."""
    await ctx.child(leaf, x)
    return str(await ctx.wait_for("go"))


@flow(name="retention.spawn_then_wait")
async def spawn_then_wait(ctx: Context, x: int) -> str:
    """A detached child that settles while its parent stays open on an event."""
    await ctx.spawn(leaf, x)
    return str(await ctx.wait_for("go"))


@flow(name="retention.waits")
async def waits(ctx: Context) -> str:
    return str(await ctx.wait_for("go"))


@flow(name="retention.hands_off")
async def hands_off(ctx: Context) -> Handoff:
    """Round 0 settles at once; round 1 stays open on an event (the lineage is open)."""
    return Handoff(waits)


@flow(name="retention.fails")
async def fails(ctx: Context) -> None:
    raise ValueError("this run fails")
