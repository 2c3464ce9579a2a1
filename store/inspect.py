"""Read-only views for operators: listings, lineages and the rows that may need a person.

Nothing here writes. Every row comes back with database time (``RunRow.now_ms``) so a
caller judges lease age and due times on the one clock the fleet agrees on. Counts and
the clock are ``store.stats``'s reads; stale leases are the stale sweep's read
(``store.sweeps``): each read exists once.
"""

from __future__ import annotations

from dataclasses import dataclass

from runfleet.store.db import Database
from runfleet.store.rows import run_row
from runfleet.store.types.run import RunRow, RunStatus, WaitingReason

DEFAULT_REACTIVATED_OVER = 3
"""Restarts from an interruption after which ``stuck`` and ``explain`` call a run looping."""


@dataclass(frozen=True, slots=True)
class Reactivated:
    """A run whose body was restarted from an interruption (takeover, release) again and again."""

    row: RunRow
    restarts: int
    """Takeovers plus releases journaled for the run."""
    takeovers: int
    last_at_ms: int


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The database server's version and clock, as ``runfleet doctor`` reports them."""

    version: str
    now_ms: int


class Inspect:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        flow: str | None = None,
        queue: str | None = None,
        since_ms: int | None = None,
        limit: int = 50,
    ) -> list[RunRow]:
        """Runs newest first, filtered by status, flow, queue and admission time."""
        rows = await self._db.all(
            "inspect.list_runs",
            {
                "status": status.value if status else None,
                "flow": flow,
                "queue": queue,
                "since_ms": since_ms,
                "limit": limit,
            },
        )
        return [run_row(r) for r in rows]

    async def lineage(self, lineage_id: str) -> list[RunRow]:
        """Every round of a handoff chain, in round order."""
        rows = await self._db.all("inspect.lineage", {"lineage_id": lineage_id})
        return [run_row(r) for r in rows]

    async def pending_older(self, older_than_ms: int, *, limit: int = 200) -> list[RunRow]:
        """Pending runs startable for longer than ``older_than_ms`` yet not started."""
        rows = await self._db.all(
            "inspect.pending_older", {"older_than_ms": older_than_ms, "limit": limit}
        )
        return [run_row(r) for r in rows]

    async def overdue_waits(self, grace_ms: int, *, limit: int = 200) -> list[RunRow]:
        """Timer and quota waits due more than ``grace_ms`` ago that nobody woke."""
        rows = await self._db.all("inspect.overdue_waits", {"grace_ms": grace_ms, "limit": limit})
        return [run_row(r) for r in rows]

    async def waiting_for(self, reason: WaitingReason, *, limit: int = 200) -> list[RunRow]:
        rows = await self._db.all("inspect.waiting_for", {"reason": reason, "limit": limit})
        return [run_row(r) for r in rows]

    async def reactivated_over(self, over: int, *, limit: int = 200) -> list[Reactivated]:
        """Unsettled runs restarted from an interruption more than ``over`` times, most first.

        A run that fails the same way at every attempt (an unstorable value before it
        was a typed error, a body that blocks its lease) loops through takeovers
        forever; no sweep and no lease rule notices, so an operator must.
        """
        rows = await self._db.all("inspect.reactivated_over", {"over": over, "limit": limit})
        return [
            Reactivated(
                row=run_row(r),
                restarts=int(r["restarts"]),
                takeovers=int(r["takeovers"]),
                last_at_ms=int(r["last_at_ms"]),
            )
            for r in rows
        ]

    async def active_queues(self, *, limit: int = 1000) -> list[str]:
        """Queues holding unsettled runs."""
        rows = await self._db.all("inspect.active_queues", {"limit": limit})
        return [r["queue"] for r in rows]

    async def waiting_deferred(self, run_id: str) -> str | None:
        """The completion name a parked run waits for, if its wait names one."""
        row = await self._db.one("inspect.waiting_deferred", {"id": run_id})
        return row["waiting_deferred"] if row else None

    async def server_info(self) -> ServerInfo:
        row = await self._db.one("inspect.server_info")
        assert row is not None
        return ServerInfo(version=str(row["version"]), now_ms=int(row["now_ms"]))
