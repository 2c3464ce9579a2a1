"""Durable flows exercised by the flow tests (imported by workers with --flows)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import psycopg

from runfleet.worker import Context, Handoff, Retry, flow
from runfleet.worker.authoring.durable import ChildFailed, WaitTimeout

CALLS: dict[str, int] = {}
"""In-process call counts (in-process workers only): proves recorded steps never re-run."""


def count(tag: str) -> int:
    CALLS[tag] = CALLS.get(tag, 0) + 1
    return CALLS[tag]


class Flaky(Exception):
    pass


def flaky(tag: str, fail_times: int) -> str:
    if count(tag) <= fail_times:
        raise Flaky(f"{tag} attempt {CALLS[tag]}")
    return f"{tag} ok"


def undo(output: Any) -> None:
    count(f"undo:{output}")


@flow(name="t.steps")
async def steps(ctx: Context, tag: str) -> list[Any]:
    a = await ctx.step("a", count, f"{tag}:a")
    b = await ctx.step("b", flaky, f"{tag}:b", 2, retry=Retry(attempts=3, backoff=0.01))
    await ctx.wait_for("go")
    c = await ctx.step("c", count, f"{tag}:c")
    return [a, b, c]


@flow(name="t.compensating")
async def compensating(ctx: Context, tag: str) -> None:
    await ctx.step("one", str, f"{tag}-1", compensate=undo)
    await ctx.step("two", str, f"{tag}-2", compensate=undo)
    await ctx.wait_for("never")


@flow(name="t.nondeterministic")
async def nondeterministic(ctx: Context, flip_file: str) -> None:
    first = "x" if not os.path.exists(flip_file) else "y"  # noqa: ASYNC240 - a test flow
    await ctx.step(first, str, first)
    await ctx.wait_for("go")


@flow(name="t.sleeper")
async def sleeper(ctx: Context, seconds: float) -> str:
    await ctx.sleep(timedelta(seconds=seconds))
    return "woke"


TOKENS: dict[str, str] = {}
"""Approval tokens as ``on_token`` delivered them, by run id (tests play the approver)."""


@flow(name="t.approver")
async def approver(ctx: Context, amount: int) -> dict[str, Any]:
    def deliver(token: str) -> None:
        TOKENS[ctx.run_id] = token

    decision = await ctx.approval("manager", request={"amount": amount}, on_token=deliver)
    return {"approved": decision.approved, "actor": decision.actor, "value": decision.value}


@flow(name="t.event_timeout")
async def event_timeout(ctx: Context) -> str:
    try:
        await ctx.wait_for("reply", timeout=0.5)
    except TimeoutError:
        return "timed out"
    return "replied"


@flow(name="t.leaf")
async def leaf(ctx: Context, value: int) -> int:
    await ctx.wait_for("release")
    return value * 2


@flow(name="t.parent")
async def parent(ctx: Context, value: int) -> dict[str, Any]:
    spawned = await ctx.spawn(leaf, value + 100)
    doubled = await ctx.child(leaf, value)
    return {"doubled": doubled, "spawned": spawned}


@flow(name="t.rounds", max_rounds=3)
async def rounds(ctx: Context, n: int) -> Any:
    if n > 0:
        return Handoff(rounds, (n - 1,))
    return "done"


@flow(name="t.sync")
def sync_flow(ctx: Any, tag: str) -> list[Any]:
    first = ctx.step("first", count, f"{tag}:sync")
    ctx.sleep(0.05)
    return [first, ctx.wait_for("go")]


@flow(name="t.quota")
async def quota(ctx: Context, wake_at_ms: int) -> str:
    await ctx.quota(wake_at_ms)
    return "after quota"


@flow(name="t.slow", timeout=0.5)
async def slow(ctx: Context) -> None:
    await asyncio.sleep(30)


def append_ledger(run_id: str, step: int, epoch: int) -> int:
    """A side effect outside runfleet: one ledger row per execution of a step."""
    with psycopg.connect(os.environ["RUNFLEET_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger (run_id, step, epoch) VALUES (%s, %s, %s)", (run_id, step, epoch)
        )
    return step


@flow(name="t.ledger")
async def ledger(ctx: Context, n: int, pause: float = 0.03) -> int:
    total = 0
    for step in range(1, 6):
        total += await ctx.step(f"s{step}", append_ledger, ctx.run_id, step, ctx.epoch)
        await asyncio.sleep(pause)
    return total + n


@flow(name="t.busy_compensating")
async def busy_compensating(ctx: Context, tag: str) -> None:
    await ctx.step("one", str, f"{tag}-1", compensate=undo)
    await asyncio.sleep(30)


@flow(name="t.many_rounds")
async def many_rounds(ctx: Context, n: int) -> Any:
    await asyncio.sleep(0.05)
    if n > 0:
        return Handoff(many_rounds, (n - 1,))
    return "done"


@flow(name="t.joiner")
async def joiner(ctx: Context, child_id: str) -> Any:
    """A parent of the shared child ``child_id`` (a diamond when two of them run)."""
    return await ctx.child(rounds, 1, run_id=child_id)


@flow(name="t.timed_child", timeout=0.5)
async def timed_child(ctx: Context) -> None:
    await ctx.wait_for("never")  # only its own deadline ends it


@flow(name="t.awaits_timed_child")
async def awaits_timed_child(ctx: Context) -> str:
    """No deadline of its own: only the child's flow timeout can end the wait."""
    try:
        await ctx.child(timed_child)
    except ChildFailed as failed:
        return f"child {failed.status}"
    return "child returned"


@flow(name="t.timed_parent", timeout=0.8)
async def timed_parent(ctx: Context) -> None:
    await ctx.spawn(leaf, 1)  # detached: keeps its own (no) deadline
    await ctx.child(leaf, 2)  # attached: never answered, bounded by this deadline


@flow(name="t.zero_wait")
async def zero_wait(ctx: Context) -> Any:
    """``wait_for(timeout=0)``: the answer if it is already there, else a timeout at once."""
    await ctx.wait_for("start")
    try:
        return await ctx.wait_for("now", timeout=0)
    except TimeoutError:
        await ctx.wait_for("after")  # parks, so a replay has to decide "now" again
        return "timed out"


@flow(name="t.failing_step")
async def failing_step(ctx: Context, tag: str) -> str:
    await ctx.step("a", count, f"{tag}:a")
    out: str = await ctx.step("b", flaky, f"{tag}:b", 5, retry=Retry(attempts=2, backoff=0.01))
    return out


@flow(name="t.publisher")
async def publisher(ctx: Context, target: str) -> dict[str, Any]:
    """DBOS-style events and messages from the body: each is one durable call."""
    await ctx.set_event("stage", "one")
    sent = await ctx.send(target, "ping", {"n": 1})
    seen = await ctx.get_event(target, "ready", timeout=10)
    await ctx.wait_for("go")  # parks: the body replays the calls above on its resume
    await ctx.set_event("stage", "two")
    await ctx.set_event("seen", seen)
    return {"sent": sent, "seen": seen}


@flow(name="t.pinged")
async def pinged(ctx: Context) -> dict[str, Any]:
    """Sets ``ready``, takes the first ping, then counts any more for 1.5 s."""
    await ctx.set_event("ready", "yes")
    first = await ctx.recv("ping", timeout=30)
    more = 0
    try:
        while True:
            await ctx.recv("ping", timeout=1.5)
            more += 1
    except WaitTimeout:
        pass
    return {"first": first, "more": more}


@flow(name="t.sync_sender")
def sync_sender(ctx: Any, target: str) -> dict[str, Any]:
    """The same calls from a ``def`` flow (``SyncContext``)."""
    sent = ctx.send(target, "ping", {"n": 2})
    return {"sent": sent, "seen": ctx.get_event(target, "ready", timeout=10)}
