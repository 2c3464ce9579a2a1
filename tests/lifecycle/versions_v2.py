"""Version v2 of ``lifecycle.versioned``: a patch adds a step, and v1 runs still replay."""

from __future__ import annotations

import os
from typing import Any

from runfleet.worker import Context, flow


@flow(name="lifecycle.versioned", version="v2", compatible=("v1",))
async def versioned(ctx: Context, gate: str) -> dict[str, Any]:
    async def one() -> int:
        return 1

    async def audit() -> str:
        return "audited"

    first = await ctx.step("one", one)
    extra = None
    if await ctx.patched("add-audit"):
        extra = await ctx.step("audit", audit)
    await ctx.recv("go")
    await ctx.recv("go2")
    path = "new" if extra else "old"
    return {"first": first, "path": path, "pid": os.getpid()}


@flow(name="lifecycle.strict", version="v2")
async def strict(ctx: Context) -> int:
    return -os.getpid()
