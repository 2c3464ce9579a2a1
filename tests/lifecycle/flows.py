"""Flows of the lifecycle tests (events, messages), run in-process and in real workers."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from runfleet.worker import Context, Retry, StepTimeout, WaitTimeout, flow
from runfleet.worker.authoring.sync_context import SyncContext


async def _mark(path: str, what: str) -> None:
    """Append one line to a side-effect ledger (O_APPEND: whole lines across processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, f"{os.getpid()} {what}\n".encode())
    finally:
        os.close(fd)


@flow(name="lifecycle.progress")
async def progress(ctx: Context) -> str:
    await ctx.set_event("stage", {"n": 1})
    go = await ctx.recv("go")
    await ctx.set_event("stage", {"n": 2, "go": go})
    await ctx.set_event("stage", {"n": 3})
    return "done"


@flow(name="lifecycle.event_then_slow")
async def event_then_slow(ctx: Context, ledger: str, ms: int) -> dict[str, Any]:
    await ctx.set_event("url", "https://pay.example/1")

    async def slow() -> int:
        await _mark(ledger, "slow-start")
        await asyncio.sleep(ms / 1000)
        return os.getpid()

    pid = await ctx.step("slow", slow)
    await ctx.set_event("url", "https://pay.example/2")
    return {"pid": pid}


@flow(name="lifecycle.consume")
async def consume(ctx: Context, n: int, ledger: str, ms: int) -> list[Any]:
    got: list[Any] = []
    for _ in range(n):
        item = await ctx.recv("item")

        async def work(value: Any = item) -> Any:
            await _mark(ledger, f"work {value}")
            await asyncio.sleep(ms / 1000)
            return value

        got.append(await ctx.step("work", work))
    return got


@flow(name="lifecycle.recv_timeout")
async def recv_timeout(ctx: Context, seconds: float) -> str:
    try:
        return str(await ctx.recv("never", timeout=seconds))
    except WaitTimeout:
        return "timed out"


@flow(name="lifecycle.sync_messages")
def sync_messages(ctx: SyncContext) -> Any:
    ctx.set_event("ready", True)
    first = ctx.recv("in")
    second = ctx.recv("in")
    ctx.set_event("ready", False)
    return [first, second, time.time() > 0]


# ---- step timeouts ---------------------------------------------------------------


def _attempt(ledger: str, what: str) -> int:
    """Record one attempt in the ledger; its number (1 = the first anywhere)."""
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, f"{os.getpid()} {what}\n".encode())
    finally:
        os.close(fd)
    with open(ledger) as f:
        return sum(1 for line in f if line.split()[1:] == [what])


@flow(name="lifecycle.async_timeout")
async def async_timeout(ctx: Context, ledger: str, slow_until: int, attempts: int) -> Any:
    async def call() -> dict[str, int]:
        n = _attempt(ledger, "async")
        if n <= slow_until:
            await asyncio.sleep(60)
        return {"attempt": n, "pid": os.getpid()}

    return await ctx.step("call", call, timeout=0.5, retry=Retry(attempts=attempts, backoff=0.01))


@flow(name="lifecycle.sync_timeout")
def sync_timeout(ctx: SyncContext, ledger: str, hang_s: float) -> Any:
    def call() -> int:
        n = _attempt(ledger, "sync")
        if n == 1:
            time.sleep(hang_s)
            _attempt(ledger, "sync-first-ended")
        return n

    return ctx.step("call", call, timeout=0.5, retry=Retry(attempts=3, backoff=0.01))


@flow(name="lifecycle.own_timeout_error")
async def own_timeout_error(ctx: Context) -> Any:
    async def call() -> None:
        raise TimeoutError("the step's own")

    try:
        await ctx.step("call", call, timeout=30)
    except StepTimeout:
        return "runfleet's"
    except TimeoutError as exc:
        return str(exc)


@flow(name="lifecycle.bad_timeout")
async def bad_timeout(ctx: Context) -> Any:
    return await ctx.step("call", _noop, timeout=-1)


async def _noop() -> None:
    return None


# ---- resume, fork ------------------------------------------------------------------


@flow(name="lifecycle.four_steps")
async def four_steps(ctx: Context, ledger: str, fail_flag: str, slow_ms: int) -> list[Any]:
    """Four steps; the third fails while ``fail_flag`` exists, the fourth takes slow_ms."""
    out: list[Any] = []
    for i in range(4):

        async def work(i: int = i) -> Any:
            _attempt(ledger, f"step{i}")
            if i == 2 and os.path.exists(fail_flag):  # noqa: ASYNC240 - a test's flag file
                raise RuntimeError("step 2 fails while the flag is there")
            if i == 3:
                await asyncio.sleep(slow_ms / 1000)
            return {"i": i, "pid": os.getpid()}

        out.append(await ctx.step(f"s{i}", work))
        if i == 0:
            await ctx.set_event("stage", "after s0")
    await ctx.set_event("stage", "done")
    return out


@flow(name="lifecycle.step_then_recv")
async def step_then_recv(ctx: Context, ledger: str) -> Any:
    async def first() -> str:
        _attempt(ledger, "first")
        return "first"

    done = await ctx.step("first", first)
    return [done, await ctx.recv("go")]


# ---- versions ----------------------------------------------------------------------
# Two deployments of one flow name: tests.lifecycle.versions_v1 / versions_v2 register it.
