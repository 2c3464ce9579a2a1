"""The bounded, cursor-based reads the sweeps drive, and the per-kind sweep lock."""

from __future__ import annotations

import enum

from store.db import Database
from store.types import Owner, PendingCursor, StaleRunning

_START = PendingCursor(run_id="", created_at_ms=-1)


class SweepKind(enum.IntEnum):
    PARKED = 1
    STALE_RUNNING = 2
    DUE_CLOCKS = 3
    PENDING_CANCELLATIONS = 4
    LOST_PENDING = 5


class Sweeps:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def try_lock(self, kind: SweepKind) -> bool:
        """Take this tick's advisory lock for a sweep kind; only inside a transaction.

        The lock is transaction-scoped, so it is released when the sweeper's
        transaction ends (including when its connection dies).
        """
        row = await self._db.one("sweeps.try_sweep_lock", {"kind": int(kind)})
        return bool(row and row["locked"])

    async def stale_running(self, stale_after_ms: int, limit: int = 64) -> list[StaleRunning]:
        """Running rows whose lease is older than ``stale_after_ms`` by database time."""
        rows = await self._db.all(
            "sweeps.stale_running", {"stale_after_ms": stale_after_ms, "limit": limit}
        )
        return [
            StaleRunning(
                run_id=r["id"],
                owner=Owner(r["owner_host"], int(r["owner_pid"]), r["owner_nonce"]),
                heartbeat_at_ms=int(r["heartbeat_at_ms"]),
            )
            for r in rows
        ]

    async def pending_runs(
        self,
        *,
        older_than_ms: int = 0,
        flow: str | None = None,
        after: PendingCursor | None = None,
        through: PendingCursor | None = None,
        limit: int = 64,
    ) -> list[PendingCursor]:
        """Runnable pending admissions, oldest first, strictly after ``after``."""
        after = after or _START
        rows = await self._db.all(
            "sweeps.pending_runs",
            {
                "older_than_ms": older_than_ms,
                "flow": flow,
                "after_ms": after.created_at_ms,
                "after_id": after.run_id,
                "through_ms": through.created_at_ms if through else None,
                "through_id": through.run_id if through else None,
                "limit": limit,
            },
        )
        return [PendingCursor(r["id"], int(r["created_at_ms"])) for r in rows]

    async def pending_tail(
        self, *, older_than_ms: int = 0, flow: str | None = None
    ) -> PendingCursor | None:
        """The newest eligible pending admission: bounds one finite scan cycle."""
        row = await self._db.one(
            "sweeps.pending_tail", {"older_than_ms": older_than_ms, "flow": flow}
        )
        return PendingCursor(row["id"], int(row["created_at_ms"])) if row else None

    async def pending_cancellations(
        self, *, after: PendingCursor | None = None, limit: int = 64
    ) -> list[PendingCursor]:
        after = after or _START
        rows = await self._db.all(
            "sweeps.pending_cancellations",
            {"after_ms": after.created_at_ms, "after_id": after.run_id, "limit": limit},
        )
        return [PendingCursor(r["id"], int(r["created_at_ms"])) for r in rows]

    async def runnable_suspended(self, *, older_than_ms: int, limit: int = 64) -> list[str]:
        rows = await self._db.all(
            "sweeps.runnable_suspended", {"older_than_ms": older_than_ms, "limit": limit}
        )
        return [r["id"] for r in rows]

    async def stranded_claims(
        self, stale_after_ms: int, limit: int = 64
    ) -> list[tuple[str, Owner, int]]:
        rows = await self._db.all(
            "sweeps.stranded_claims", {"stale_after_ms": stale_after_ms, "limit": limit}
        )
        return [
            (
                r["id"],
                Owner(r["claim_host"], int(r["claim_pid"]), r["claim_nonce"]),
                int(r["claimed_at_ms"]),
            )
            for r in rows
        ]
