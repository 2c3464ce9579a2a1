"""The recovery flows plus flows a later worker no longer has (a retired deployment).

A worker started with ``--flows tests.fleet.recovery_flows`` cannot take runs of these:
they are the rows nobody can take that a sweep must read past.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runfleet.worker import Context, flow
from tests.fleet.recovery_flows import nap, waiter

__all__ = ["nap", "retired_forever", "retired_waiter", "waiter"]


@flow(name="rec.retired_forever")
async def retired_forever(ctx: Context) -> None:
    await asyncio.Event().wait()


@flow(name="rec.retired_waiter")
async def retired_waiter(ctx: Context) -> Any:
    return await ctx.wait_for("go")
