"""Version v1 of ``lifecycle.versioned`` (a worker of the old deployment imports this)."""

from __future__ import annotations

import os
from typing import Any

from runfleet.worker import Context, flow


@flow(name="lifecycle.versioned", version="v1")
async def versioned(ctx: Context, gate: str) -> dict[str, Any]:
    async def one() -> int:
        return 1

    first = await ctx.step("one", one)
    await ctx.recv("go")
    await ctx.recv("go2")  # parks here: the test deploys v2 meanwhile
    return {"first": first, "path": "old", "pid": os.getpid()}


@flow(name="lifecycle.strict", version="v1")
async def strict(ctx: Context) -> int:
    return os.getpid()
