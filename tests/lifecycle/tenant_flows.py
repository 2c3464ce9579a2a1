"""A class-bound flow (``worker.authoring.instances``): one definition, one configured instance per
tenant. The instances are made by ``tenants_all`` / ``tenants_acme`` (a worker's
``--flows`` module decides which tenants it serves)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runfleet.worker import Context, FlowInstance, flow
from runfleet.worker.authoring.sync_context import SyncContext


def _mark(path: str, what: str) -> None:
    """Append one line to a side-effect ledger (O_APPEND: whole lines across processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, f"{os.getpid()} {what}\n".encode())
    finally:
        os.close(fd)


class Tenant(FlowInstance):
    """A tenant's configuration: what its flows and steps read from ``self``."""

    def __init__(self, instance_name: str, greeting: str) -> None:
        super().__init__(instance_name=instance_name, scopes=["*"])  # unscoped test runs
        self.greeting = greeting

    async def greet(self, ledger: str, who: str) -> str:
        _mark(ledger, f"greet {self.instance_name}")
        return f"{self.greeting}, {who}"

    async def slow(self, ledger: str, ms: int) -> int:
        _mark(ledger, f"slow {self.instance_name}")
        await asyncio.sleep(ms / 1000)
        return os.getpid()

    def shout_step(self, text: str) -> str:
        return f"{text.upper()} [{self.instance_name}]"

    @flow(name="lifecycle.tenant.welcome")
    async def welcome(self, ctx: Context, ledger: str, who: str, ms: int) -> dict[str, Any]:
        text = await ctx.step("greet", self.greet, ledger, who)
        pid = await ctx.step("slow", self.slow, ledger, ms)
        loud = await ctx.child(self.shout, text)
        return {"text": text, "pid": pid, "loud": loud, "instance": self.instance_name}

    @flow(name="lifecycle.tenant.shout")
    def shout(self, ctx: SyncContext, text: str) -> str:
        return str(ctx.step("shout", self.shout_step, text))
