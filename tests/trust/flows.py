"""Flows the trust tests answer, forge and squat on (registered on import)."""

from __future__ import annotations

from typing import Any

from runfleet.worker import flow
from runfleet.worker.authoring.context import Context

TOKENS: dict[str, str] = {}
"""Approval tokens as ``on_token`` delivered them, by run id: the tests are the approver."""


@flow(name="trust.waiter")
async def waiter(ctx: Context) -> Any:
    return await ctx.wait_for("go")


@flow(name="trust.approver")
async def approver(ctx: Context) -> dict[str, Any]:
    async def deliver(token: str) -> None:
        TOKENS[ctx.run_id] = token

    decision = await ctx.approval("manager", request={"amount": 5}, on_token=deliver)
    return {"approved": decision.approved, "actor": decision.actor, "value": decision.value}


@flow(name="trust.sleeper")
async def sleeper(ctx: Context) -> str:
    await ctx.sleep(3600)
    return "slept"


@flow(name="trust.blocked_child")
async def blocked_child(ctx: Context) -> Any:
    return await ctx.wait_for("release")


@flow(name="trust.parent")
async def parent(ctx: Context) -> Any:
    return await ctx.child(blocked_child)


@flow(name="trust.quota")
async def quota(ctx: Context, wake_at_ms: int) -> str:
    await ctx.quota(wake_at_ms)
    return "done"


@flow(name="trust.odd_event")
async def odd_event(ctx: Context) -> Any:
    """Declares an event in an internal-looking namespace: declared, so answerable."""
    return await ctx.wait_for("child:not-a-child")


@flow(name="trust.spawner")
async def spawner(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.spawn(leaf, i)
    return n


@flow(name="trust.stepper")
async def stepper(ctx: Context, n: int) -> int:
    for i in range(n):
        await ctx.step("s", _same, i)
    return n


@flow(name="trust.leaf")
async def leaf(ctx: Context, i: int) -> int:
    return i


def _same(i: int) -> int:
    return i


UNDONE: list[Any] = []
"""What compensations ran, in order (in-process workers only)."""


def undo(output: Any) -> None:
    UNDONE.append(output)


@flow(name="trust.compensating")
async def compensating(ctx: Context, tag: str) -> None:
    await ctx.step("one", str, f"{tag}-1", compensate=undo)
    await ctx.step("two", str, f"{tag}-2", compensate=undo)
    await ctx.step("three", str, f"{tag}-3", compensate=undo)
    await ctx.wait_for("never")


def plain_add(a: int, b: int) -> int:
    """A plain function of a module that registers flows: runnable rq-style."""
    return a + b


@flow(name="trust.sneaky")
async def sneaky(ctx: Context) -> Any:
    """Waits, as an event, on the name its own spawned child settles through."""
    child_id = await ctx.spawn(blocked_child)
    return await ctx.wait_for(f"child:{child_id}")


@flow(name="trust.bad_compensation")
async def bad_compensation(ctx: Context) -> str:
    """Declares os.getenv (a real function, of a module no worker allows) as compensation."""
    try:
        await ctx.step("x", str, "x", compensate=_os_getenv())
    except Exception as exc:
        return type(exc).__name__
    return "recorded"


def _os_getenv() -> Any:
    import os

    return os.getenv
