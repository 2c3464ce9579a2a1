"""Flows of the queue tests: a nap whose start and end the journal and a ledger record."""

from __future__ import annotations

import time

from worker import flow


def nap(ms: int) -> int:
    """A plain function: sleeps ``ms`` milliseconds (holds its worker slot that long)."""
    time.sleep(ms / 1000)
    return ms


@flow(name="queues.urgent", priority=7)
async def urgent(ctx: object) -> str:
    """A flow whose runs default to priority 7 (``@flow(priority=...)``)."""
    return "urgent"
