"""The flow the partition suite runs: every step and every stretch of body code leaves a
line in a side-effect ledger that no partition can cut off.

The ledger is a file on the filesystem every namespace shares, appended with O_APPEND
(one ``write`` per line, so lines from concurrent processes never interleave). It is the
stand-in for any outside system a flow touches (a payment API, an e-mail): runfleet does
not control it, so it shows exactly what each host *did*, whatever the journal says.

Lines (JSON, wall-clock milliseconds from ``time.time()``):

- ``body``: the flow body is about to call step ``step`` (body code ran at ``t_ms``);
- ``start``: step ``step`` began executing (its body, after the durable attempt start);
- ``end``: step ``step`` finished executing, with ``start_ms`` and ``t_ms`` (the end).

Each carries ``run``, ``host`` (``RUNFLEET_HOST_ID``), ``pid`` and ``mode`` (``async``:
the step awaits ``asyncio.sleep``; ``sync``: a plain function that ``time.sleep``s in a
worker thread, which task cancellation cannot stop).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from runfleet.worker import Context, flow


def note(ledger: str, **fields: Any) -> float:
    """Append one line; returns its time (ms)."""
    now = time.time() * 1000
    line = {
        **fields,
        "host": os.environ.get("RUNFLEET_HOST_ID", "?"),
        "pid": os.getpid(),
        "t_ms": now,
    }
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
    return now


def sync_step(ledger: str, run: str, step: int, ms: int) -> int:
    started = note(ledger, phase="start", run=run, step=step, mode="sync")
    time.sleep(ms / 1000)
    note(ledger, phase="end", run=run, step=step, mode="sync", start_ms=started)
    return step


async def async_step(ledger: str, run: str, step: int, ms: int) -> int:
    started = note(ledger, phase="start", run=run, step=step, mode="async")
    await asyncio.sleep(ms / 1000)
    note(ledger, phase="end", run=run, step=step, mode="async", start_ms=started)
    return step


@flow(name="partition.ledgered")
async def ledgered(
    ctx: Context, ledger: str, steps: int, step_ms: int, sync: bool
) -> dict[str, Any]:
    """``steps`` steps of ``step_ms`` each; a replay re-runs only the unrecorded ones."""
    mode = "sync" if sync else "async"
    body = sync_step if sync else async_step
    for index in range(steps):
        note(ledger, phase="body", run=ctx.run_id, step=index, mode=mode)
        await ctx.step(f"s{index}", body, ledger, ctx.run_id, index, step_ms)
    return {"steps": steps, "host": os.environ.get("RUNFLEET_HOST_ID", "?")}
