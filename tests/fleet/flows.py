"""Flows the fleet tests run in real worker processes (imported with --flows)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from runfleet.worker import Context, flow


def add(a: int, b: int) -> int:
    """A plain function: an rq-style implicit single-step flow."""
    return a + b


@flow(name="tests.sleepy")
async def sleepy(ctx: Context, ms: int, tag: str = "") -> dict[str, Any]:
    await asyncio.sleep(ms / 1000)
    return {"slept": ms, "tag": tag, "pid": os.getpid()}


@flow(name="tests.sync_sleepy")
def sync_sleepy(ctx: Context, ms: int) -> dict[str, Any]:
    time.sleep(ms / 1000)
    return {"slept": ms, "pid": os.getpid()}


@flow(name="tests.boom")
async def boom(ctx: Context, message: str) -> None:
    raise ValueError(message)


@flow(name="tests.unencodable")
async def unencodable(ctx: Context) -> object:
    return {1, 2, 3}


@flow(name="tests.forever")
async def forever(ctx: Context) -> None:
    await asyncio.Event().wait()


# ---- side-effect ledger: what each owner really executed, and when ----------------


def ledger_write(path: str, **fields: Any) -> None:
    """Append one JSON line (O_APPEND: whole lines even from several processes)."""
    import json

    line = json.dumps({"pid": os.getpid(), "t_ms": int(time.time() * 1000), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _ledger_step(path: str, run: str, i: int, ms: int) -> int:
    ledger_write(path, run=run, step=i, at="start")
    await asyncio.sleep(ms / 1000)
    ledger_write(path, run=run, step=i, at="end")
    return i


def _ledger_sync_step(path: str, run: str, i: int, ms: int) -> int:
    ledger_write(path, run=run, step=i, at="start")
    time.sleep(ms / 1000)
    ledger_write(path, run=run, step=i, at="end")
    return i


@flow(name="tests.ledger_steps")
async def ledger_steps(ctx: Context, path: str, steps: int, ms: int) -> dict[str, Any]:
    """``steps`` async steps of ``ms`` each, every start and end written to the ledger."""
    for i in range(steps):
        await ctx.step(f"s{i}", _ledger_step, path, ctx.run_id, i, ms)
    return {"pid": os.getpid()}


@flow(name="tests.ledger_sync_steps")
async def ledger_sync_steps(ctx: Context, path: str, steps: int, ms: int) -> dict[str, Any]:
    """Like ``ledger_steps`` but each step is a plain function, run in a thread."""
    for i in range(steps):
        await ctx.step(f"s{i}", _ledger_sync_step, path, ctx.run_id, i, ms)
    return {"pid": os.getpid()}


@flow(name="tests.block_loop")
async def block_loop(ctx: Context, path: str, seconds: float) -> dict[str, Any]:
    """CPU-bound code on the event loop: nothing can interrupt it but the watchdog."""
    ledger_write(path, run=ctx.run_id, at="blocking")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    ledger_write(path, run=ctx.run_id, at="unblocked")
    return {"pid": os.getpid()}


@flow(name="tests.sync_body_sync_step")
def sync_body_sync_step(ctx: Any, ms: int) -> dict[str, Any]:
    """A plain-def body (a thread for the whole run) whose step needs a second thread."""
    slept = ctx.step("nap", _nap, ms)
    return {"slept": slept, "pid": os.getpid()}


def _nap(ms: int) -> int:
    time.sleep(ms / 1000)
    return ms


def _booked(path: str, run: str) -> dict[str, str]:
    return {"path": path, "run": run}


def undo_booking(output: dict[str, str]) -> None:
    """The compensation of ``compensated_sleep``'s step: one ledger line where it ran."""
    ledger_write(output["path"], run=output["run"], at="compensated")


@flow(name="tests.compensated_sleep")
async def compensated_sleep(ctx: Context, path: str, ms: int) -> dict[str, Any]:
    """One step with a compensation, then a long sleep: a cancel must undo the step."""
    await ctx.step("book", _booked, path, ctx.run_id, compensate=undo_booking)
    await asyncio.sleep(ms / 1000)
    return {"pid": os.getpid()}
