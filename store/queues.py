"""Per-queue settings (``runfleet.queues``): the default priority, changed live.

A change is one statement that writes the settings and appends the change with the
authenticated role that made it (``runfleet.queue_changes``): who changed a queue is the
database's answer, never a caller-supplied name. Admission reads the default priority in
its own statement (the ``runs_default_priority`` trigger), so a change applies to the
next admission on every producer at once, with no process to restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from runfleet.store import validate
from runfleet.store.db import Database
from runfleet.store.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class QueueSettings:
    name: str
    default_priority: int
    concurrency: int | None
    """Fleet-wide: at most this many of its runs execute at once (None: no limit)."""
    rate_per_s: float | None
    """Fleet-wide: at most this many starts per second (a token bucket of one second's)."""
    updated_at_ms: int
    updated_by: str
    """The database role that made the latest change."""


@dataclass(frozen=True, slots=True)
class QueueChange:
    queue: str
    change: dict[str, Any]
    note: str | None
    changed_by: str
    at_ms: int


def _settings(row: dict[str, Any]) -> QueueSettings:
    return QueueSettings(
        row["name"],
        int(row["default_priority"]),
        row["concurrency"],
        row["rate_per_s"],
        int(row["updated_at_ms"]),
        row["updated_by"],
    )


class Queues:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(
        self,
        name: str,
        *,
        default_priority: int | None = None,
        concurrency: int | None = None,
        rate_per_s: float | None = None,
        note: str | None = None,
    ) -> QueueSettings:
        """Change the settings given (the others stay), journaled with who changed them.

        ``concurrency``: the fleet-wide limit, applied by the next claim of every worker
        (it is read in the claim statement); 0 lifts it. Runs already executing beyond a
        lowered limit finish; no new one starts until the count is under it.
        """
        validate.identifier("queue", name)
        change: dict[str, Any] = {}
        if default_priority is not None:
            change["default_priority"] = validate.priority(default_priority, "default_priority")
        if concurrency is not None:
            if isinstance(concurrency, bool) or not isinstance(concurrency, int):
                raise InvalidInput("concurrency", "must be an integer")
            if not 0 <= concurrency <= 1_000_000:
                raise InvalidInput("concurrency", "must be between 0 (no limit) and 1000000")
            change["concurrency"] = concurrency or None
        if rate_per_s is not None:
            if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float):
                raise InvalidInput("rate", "must be a number of starts per second")
            if not 0 <= rate_per_s <= 1_000_000 or rate_per_s != rate_per_s:
                raise InvalidInput("rate", "must be between 0 (no limit) and 1000000 per second")
            change["rate_per_s"] = float(rate_per_s) or None
        if not change:
            raise InvalidInput("settings", "name at least one setting to change")
        row = await self._db.one(
            "queues.set",
            {
                "name": name,
                "default_priority": default_priority,
                "concurrency": concurrency,
                "rate_per_s": None if rate_per_s is None else float(rate_per_s),
                "change": Jsonb(change),
                "note": note,
            },
        )
        assert row is not None  # an upsert always returns its row
        return _settings(row)

    async def get(self, name: str) -> QueueSettings | None:
        row = await self._db.one("queues.get", {"name": name})
        return _settings(row) if row else None

    async def all(self) -> list[QueueSettings]:
        return [_settings(r) for r in await self._db.all("queues.all")]

    async def wait_ms(self, name: str) -> int | None:
        """Milliseconds until the queue's rate allows a start (0: now; None: no rate)."""
        row = await self._db.one("queues.wait", {"name": name})
        return None if row is None or row["wait_ms"] is None else int(row["wait_ms"])

    async def running(self, names: list[str]) -> dict[str, int]:
        """How many runs of each of ``names`` execute now (0 for the others)."""
        rows = await self._db.all("queues.running", {"names": names})
        found = {r["queue"]: int(r["running"]) for r in rows}
        return {name: found.get(name, 0) for name in names}

    async def changes(self, name: str, limit: int = 20) -> list[QueueChange]:
        """The queue's latest changes, newest first."""
        rows = await self._db.all("queues.changes", {"name": name, "limit": limit})
        return [
            QueueChange(r["queue"], r["change"], r["note"], r["changed_by"], int(r["at_ms"]))
            for r in rows
        ]
