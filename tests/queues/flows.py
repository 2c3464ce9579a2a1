"""Flows of the queue tests: a nap whose start and end the journal and a ledger record."""

from __future__ import annotations

import os
import time

from runfleet.worker import flow


def nap(ms: int) -> int:
    """A plain function: sleeps ``ms`` milliseconds (holds its worker slot that long)."""
    time.sleep(ms / 1000)
    return ms


@flow(name="queues.urgent", priority=7)
async def urgent(ctx: object) -> str:
    """A flow whose runs default to priority 7 (``@flow(priority=...)``)."""
    return "urgent"


def ledger_nap(path: str, tag: str, ms: int) -> str:
    """Append ``start``/``end`` lines (tag, pid, wall time) around a nap: the serial-queue
    chaos test reads them to prove no two bodies ever ran at once."""
    with open(path, "a") as ledger:
        ledger.write(f"start {tag} {os.getpid()} {time.time():.6f}\n")
    time.sleep(ms / 1000)
    with open(path, "a") as ledger:
        ledger.write(f"end {tag} {os.getpid()} {time.time():.6f}\n")
    return tag


def tenant_nap(t: str, ms: int) -> str:
    """A nap keyed by its tenant ``t`` (the fairness test keys the flow by ``kwargs.t``)."""
    time.sleep(ms / 1000)
    return t
