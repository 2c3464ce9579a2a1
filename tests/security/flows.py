"""Flows the security tests run: every kind of row a run owns (step, child, clock, event)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from runfleet.worker import Context, flow


@flow(name="sec.leaf")
async def leaf(ctx: Context, n: int) -> int:
    return n * 2


@flow(name="sec.full")
async def full(ctx: Context, tag: str) -> dict[str, Any]:
    """A step, a child, a durable sleep and an event: journal, steps, attempts,
    run_parents, clocks and deferreds all get rows, written by the worker role."""
    upper = await ctx.step("upper", str.upper, tag)
    kid = await ctx.child(leaf, 21)
    await ctx.sleep(timedelta(milliseconds=50))
    answer = await ctx.wait_for("go")
    return {"upper": upper, "kid": kid, "answer": answer}


@flow(name="sec.parent")
async def parent(ctx: Context, n: int) -> int:
    """One child: its admission records a parent edge (the run DAG's insert)."""
    return int(await ctx.child(leaf, n))


@flow(name="sec.slow")
async def slow(ctx: Context, seconds: float) -> str:
    """Long enough in one step for its worker to be SIGKILLed while it owns the run."""
    await ctx.step("nap", asyncio.sleep, seconds)
    return "rested"


TOKENS: dict[str, str] = {}
"""Approval tokens as ``on_token`` delivered them, by run id (tests play the approver)."""


@flow(name="sec.approver")
async def approver(ctx: Context) -> dict[str, Any]:
    def deliver(token: str) -> None:
        TOKENS[ctx.run_id] = token

    decision = await ctx.approval("boss", on_token=deliver)
    return {"approved": decision.approved, "actor": decision.actor}


@flow(name="sec.fails")
async def fails(ctx: Context, why: str) -> None:
    """Fails every time: a run for the failed registry (requeue admits its next round)."""
    raise RuntimeError(why)
