"""The flow registry: which flows some worker has registered, by name (``runfleet.flows``).

Workers write it at start (one row per ``@flow``, refreshed on every start); producers
read it to refuse a late-bound ``"module:function"`` name that no worker knows, before
any write (``producer.queue``), and ``runfleet schedule add`` checks a schedule's flow the
same way. It is a catalogue, not a permission: a worker still resolves every name against
its own code (``worker.resolver``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runfleet.store.db import Database


@dataclass(frozen=True, slots=True)
class RegisteredFlow:
    name: str
    queue: str
    signature: str | None
    last_seen_ms: int
    """Database time of the latest worker start that registered it."""


class FlowRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(self, name: str, queue: str, signature: str | None) -> None:
        """Record (or refresh) a flow a starting worker serves; its queue and signature win."""
        await self._db.execute(
            "registry.register", {"name": name, "queue": queue, "signature": signature}
        )

    async def get(self, name: str) -> RegisteredFlow | None:
        """The registered flow called ``name``; None if no worker ever registered it."""
        row = await self._db.one("registry.get", {"name": name})
        if row is None:
            return None
        return RegisteredFlow(row["name"], row["queue"], row["signature"], int(row["last_seen_ms"]))
