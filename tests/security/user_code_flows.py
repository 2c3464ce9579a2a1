"""Hostile and careless flow bodies: BaseExceptions out of bodies, steps and tasks, and
poison runs that end their process on every execution (tests/security/test_user_code.py,
tests/security/test_poison_runs.py).

Every flow here is run by real ``runfleet worker`` processes (``--flows`` this module).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from runfleet.worker import Context, flow
from runfleet.worker.authoring.context import Interrupted
from runfleet.worker.authoring.durable import Cause, Suspended


class Hostile(BaseException):
    """A BaseException of the user's own, which no ``except Exception`` catches."""


class HostileExit(SystemExit):
    """A subclass of SystemExit: the event loop re-raises it like SystemExit itself."""


def _raise(kind: str) -> None:
    """Raise the BaseException named ``kind`` (the same words every flow below takes)."""
    match kind:
        case "exit":
            sys.exit(3)
        case "keyboard":
            raise KeyboardInterrupt("pressed in a flow body")
        case "cancelled":
            raise asyncio.CancelledError("not runfleet's")
        case "generator-exit":
            raise GeneratorExit("closed by hand")
        case "custom":
            raise Hostile("a BaseException of the user's own")
        case "exit-subclass":
            raise HostileExit(7)
        case "forged-interrupted":  # runfleet's own control exceptions, raised by the body
            raise Interrupted(Cause.LOST_FENCE)
        case "forged-suspended":
            raise Suspended("timer")
    raise ValueError(f"unknown kind {kind!r}")


@flow(name="uc.async_body")
async def async_body(ctx: Context, kind: str) -> str:
    await ctx.step("before", str.upper, kind)  # a recorded step first: the run had started
    _raise(kind)
    return "unreachable"


@flow(name="uc.sync_body")
def sync_body(ctx: object, kind: str) -> str:
    """A plain ``def`` flow: its body runs in a thread of the worker."""
    _raise(kind)
    return "unreachable"


async def _async_step(kind: str) -> None:
    _raise(kind)


@flow(name="uc.async_step")
async def async_step(ctx: Context, kind: str) -> str:
    await ctx.step("raises", _async_step, kind)
    return "unreachable"


@flow(name="uc.sync_step")
async def sync_step(ctx: Context, kind: str) -> str:
    """``_raise`` as a sync step function: it runs in a thread."""
    await ctx.step("raises", _raise, kind)
    return "unreachable"


async def _in_task(kind: str) -> None:
    await asyncio.sleep(0)
    _raise(kind)


@flow(name="uc.sub_task")
async def sub_task(ctx: Context, kind: str) -> str:
    """A task the body creates raises it: the loop sees it first, not the body."""
    await asyncio.gather(asyncio.create_task(_in_task(kind)))
    return "unreachable"


@flow(name="uc.swallowing_step")
async def swallowing_step(ctx: Context, kind: str) -> str:
    """A body may catch a step's BaseException itself: then it is the body's business."""
    try:
        await ctx.step("raises", _async_step, kind)
    except BaseException as exc:  # the test is exactly that a body may
        return f"caught {type(exc).__name__}"
    return "unreachable"


def plain_raises(kind: str, report: str = "") -> str:
    """A plain function enqueued rq-style (an implicit one-step flow)."""
    _raise(kind)
    return "unreachable"


def on_failure(job: Any, connection: object, type_: type, value: object, tb: str) -> None:
    """rq's on_failure callback (runs in the worker, as a recorded step, after the function
    failed): writes what it was told to the file the run's second argument names."""
    Path(job.args[1]).write_text(type_.__name__)


@flow(name="uc.alive")
async def alive(ctx: Context, tag: str) -> dict[str, object]:
    """Proof of life: which process ran it."""
    return {"tag": tag, "pid": os.getpid()}


@flow(name="uc.nap")
async def nap(ctx: Context, seconds: float) -> dict[str, object]:
    """A run that is executing while its neighbours misbehave."""
    await asyncio.sleep(seconds)
    return {"pid": os.getpid()}


@flow(name="uc.forever")
async def forever(ctx: Context) -> None:
    """Runs until runfleet cancels or releases it."""
    await asyncio.Event().wait()


# ---- poison runs -----------------------------------------------------------------


def _note_execution(ledger: str) -> None:
    """One line per execution of the body, written before it ends its process."""
    with Path(ledger).open("a") as f:
        f.write(f"{os.getpid()} {time.time():.3f}\n")
        f.flush()
        os.fsync(f.fileno())


@flow(name="uc.poison")
async def poison(ctx: Context, ledger: str, fixed_marker: str, how: str = "exit") -> str:
    """Ends its worker process on every execution until ``fixed_marker`` exists."""
    await ctx.step("prepare", str.upper, "x")
    if os.path.exists(fixed_marker):  # noqa: ASYNC240 - one stat, in a test flow
        return "fixed"
    _note_execution(ledger)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)
