"""A flow of three trivial steps, and a one-second sleep: the work ``bench capacity``
costs per step, and the flows benchmarks run beside DBOS.

The step functions are plain and shared: runfleet records them with ``ctx.step``, the
DBOS side (a checkout's ``bench/dbos_app.py``) wraps the very same functions with
``DBOS.step``.
"""

from __future__ import annotations

import time

from runfleet.worker import Context, flow

QUEUE = "bench-flows"


def add_one(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return x * 2


def subtract_one(x: int) -> int:
    return x - 1


@flow(name="bench.three_steps", queue=QUEUE)
async def three_steps(ctx: Context, x: int) -> int:
    a = await ctx.step("add_one", add_one, x)
    b = await ctx.step("double", double, a)
    return int(await ctx.step("subtract_one", subtract_one, b))


@flow(name="bench.sleep_once", queue=QUEUE)
async def sleep_once(ctx: Context, seconds: float) -> int:
    """Sleep durably, then answer when the body went on (wall ms, this host's clock)."""
    await ctx.sleep(seconds)
    return int(time.time() * 1000)
