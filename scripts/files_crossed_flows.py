"""The one flow ``scripts/files_crossed.py`` runs: one step, then its result."""

from __future__ import annotations

from runfleet.worker import Context, flow


def _double(n: int) -> int:
    return 2 * n


@flow(name="files_crossed.one_step")
async def one_step(ctx: Context, n: int) -> int:
    return int(await ctx.step("double", _double, n))
