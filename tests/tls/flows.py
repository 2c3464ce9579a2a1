"""A flow the TLS tests run end to end."""

from __future__ import annotations

from runfleet.worker import Context, flow


def square(x: int) -> int:
    return x * x


@flow(name="tls.square")
async def squared(ctx: Context, x: int) -> int:
    return int(await ctx.step("square", square, x))
