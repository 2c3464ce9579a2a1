"""Work the fleet benchmark runs: no-ops for throughput, naps for takeover and memory.

Importable by both sides: rq workers import ``noop`` by its dotted path, runfleet workers
import this module with ``--flows bench.noop`` so the ``@flow`` decorators register.
"""

from __future__ import annotations

import asyncio

from runfleet.worker import Context, flow

QUEUE = "bench"


def noop() -> None:
    """The rq side's job (and a plain-function run on the runfleet side): does nothing."""


@flow(name="bench.noop", queue=QUEUE)
async def noop_flow(ctx: Context) -> None:
    """The runfleet side's run: a native async flow that does nothing."""


@flow(name="bench.nap", queue=QUEUE)
async def nap(ctx: Context, seconds: float) -> None:
    """Hold a slot for ``seconds`` (in-memory wait, no durable call): a run in flight."""
    await asyncio.sleep(seconds)
