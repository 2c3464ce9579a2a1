"""The failover suite's flow: five recorded steps, each execution and each acknowledged
record written to a ledger outside the cluster (the shared session database).

``ha_ledger`` has one ``exec`` row per execution of a step body and one ``ack`` row once
``ctx.step`` has returned, i.e. once runfleet told the flow the record was committed. An
execution of a step after its ``ack`` is a recorded step executed again: with
synchronous replication there is none; with asynchronous replication it is what a
failover that forgot the record costs.
"""

from __future__ import annotations

import asyncio
import os
import threading

from psycopg_pool import ConnectionPool

from runfleet.worker import Context, flow

STEPS = 5
_pool: ConnectionPool | None = None
_lock = threading.Lock()


def _ledger() -> ConnectionPool:
    global _pool
    with _lock:
        if _pool is None:
            url = os.environ["RUNFLEET_HA_LEDGER_URL"]
            _pool = ConnectionPool(url, min_size=1, max_size=8, kwargs={"autocommit": True})
        return _pool


def note(run_id: str, step: int, epoch: int, what: str) -> int:
    with _ledger().connection() as conn:
        conn.execute(
            "INSERT INTO ha_ledger (run_id, step, epoch, what) VALUES (%s, %s, %s, %s)",
            (run_id, step, epoch, what),
        )
    return step


@flow(name="ha.five_steps")
async def five_steps(ctx: Context, n: int) -> int:
    total = 0
    for step in range(1, STEPS + 1):
        total += await ctx.step(f"s{step}", note, ctx.run_id, step, ctx.epoch, "exec")
        await asyncio.to_thread(note, ctx.run_id, step, ctx.epoch, "ack")
        await ctx.sleep(0.01)
    return total + n
