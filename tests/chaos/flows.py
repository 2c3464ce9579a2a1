"""Flows for the chaos tests (imported by worker processes with ``--flows``).

The ledger lives in a database the chaos never touches (``RUNFLEET_CHAOS_LEDGER_URL``):
the servers being broken are runfleet's, and the user's own side effect must not fail
for them, so any run that fails failed because runfleet let an infrastructure error
through.
"""

from __future__ import annotations

import os
import threading

from psycopg_pool import ConnectionPool

from runfleet.worker import Context, flow
from runfleet.worker.authoring.sync_context import SyncContext

STEPS = 5
_pool: ConnectionPool | None = None
_pool_lock = threading.Lock()


def _ledger() -> ConnectionPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            url = os.environ["RUNFLEET_CHAOS_LEDGER_URL"]
            _pool = ConnectionPool(url, min_size=1, max_size=8, kwargs={"autocommit": True})
        return _pool


def append_ledger(run_id: str, step: int, epoch: int) -> int:
    """One ledger row per execution of a step: a side effect outside runfleet."""
    with _ledger().connection() as conn:
        conn.execute(
            "INSERT INTO chaos_ledger (run_id, step, epoch) VALUES (%s, %s, %s)",
            (run_id, step, epoch),
        )
    return step


@flow(name="chaos.five_steps")
async def five_steps(ctx: Context, n: int) -> int:
    """Five recorded steps, each followed by a short durable (in-process) sleep."""
    total = 0
    for step in range(1, STEPS + 1):
        total += await ctx.step(f"s{step}", append_ledger, ctx.run_id, step, ctx.epoch)
        await ctx.sleep(0.01)
    return total + n


@flow(name="chaos.sync_five_steps")
def sync_five_steps(ctx: SyncContext, n: int) -> int:
    """The same through the sync Context (a ``def`` flow runs in a thread)."""
    total = 0
    for step in range(1, STEPS + 1):
        total += ctx.step(f"s{step}", append_ledger, ctx.run_id, step, ctx.epoch)
        ctx.sleep(0.01)
    return total + n


@flow(name="chaos.two_steps")
async def two_steps(ctx: Context, tag: str) -> list[str]:
    """Two steps with no side effect outside runfleet (for in-process workers)."""
    return [await ctx.step("a", str, f"{tag}-a"), await ctx.step("b", str, f"{tag}-b")]
