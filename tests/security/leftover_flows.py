"""Flow bodies that leave something behind in their worker process: a thread that is not a
daemon, signal dispositions, a hung thread, a loop callback that exits
(tests/security/test_stop_always.py). Run by real ``runfleet worker`` processes.

Each body writes a line to a ledger (a file outside runfleet) once it has done its deed,
so the test acts on what the body did, not on a guess of when.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

from runfleet.worker import Context, flow


def _note(ledger: str, what: str) -> None:
    with Path(ledger).open("a") as f:
        f.write(f"{os.getpid()} {what}\n")
        f.flush()
        os.fsync(f.fileno())


def executions(ledger: str) -> list[str]:
    path = Path(ledger)
    return path.read_text().splitlines() if path.exists() else []


@flow(name="lo.thread")
async def leave_a_thread(ctx: Context, ledger: str) -> str:
    """Completes, leaving a non-daemon thread that sleeps for an hour."""
    threading.Thread(target=time.sleep, args=(3600,), name="left-behind", daemon=False).start()
    _note(ledger, "thread")
    return "left"


@flow(name="lo.ignore")
async def ignore_signals(ctx: Context, ledger: str) -> None:
    """Ignores SIGTERM and SIGINT (an async body runs on the loop's thread, where
    ``signal.signal`` is allowed), then runs until stopped."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _note(ledger, "ignored")
    await asyncio.Event().wait()


@flow(name="lo.block")
async def block_signals(ctx: Context, ledger: str) -> None:
    """Blocks SIGTERM and SIGINT on the loop's thread, then runs until stopped."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    _note(ledger, "blocked")
    await asyncio.Event().wait()


@flow(name="lo.stuck")
def stuck_once(ctx: object, ledger: str) -> str:
    """A sync body (a thread) that hangs for an hour on its first execution only."""
    first = not executions(ledger)
    _note(ledger, "stuck" if first else "again")
    if first:
        time.sleep(3600)
    return "second"


@flow(name="lo.exit_soon")
async def exit_from_a_callback(ctx: Context, ledger: str) -> str:
    """Schedules ``sys.exit(7)`` on the loop: raised by the loop, not by the body."""
    asyncio.get_running_loop().call_soon(sys.exit, 7)
    _note(ledger, "scheduled")
    await asyncio.sleep(30)
    return "unreachable"


@flow(name="lo.exit_later")
async def exit_after_the_run(ctx: Context, ledger: str) -> str:
    """Schedules ``sys.exit(7)`` for after the run has completed."""
    asyncio.get_running_loop().call_later(0.3, sys.exit, 7)
    _note(ledger, "scheduled")
    return "done"


@flow(name="lo.alive")
async def alive(ctx: Context) -> int:
    return os.getpid()
