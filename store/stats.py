"""Fleet-wide reads: how many runs are where, whether any rule was broken, and the clock.

Each read exists once: operators (``runfleet fleet``, the dashboard), the demo,
benchmarks and schedules all count and tell time here.
"""

from __future__ import annotations

from runfleet.store.db import Database
from runfleet.store.rows import journal_record
from runfleet.store.types import JournalRecord, Owner, RunStatus


class Stats:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def status_counts(self, *, flow: str | None = None) -> dict[RunStatus, int]:
        rows = await self._db.all("stats.status_counts", {"flow": flow})
        counts = {status: 0 for status in RunStatus}
        for row in rows:
            counts[RunStatus(row["status"])] = int(row["n"])
        return counts

    async def settled_more_than_once(self) -> dict[str, int]:
        rows = await self._db.all("stats.settled_more_than_once")
        return {row["run_id"]: int(row["n"]) for row in rows}

    async def records_of_kind(
        self, kind: str, *, after_seq: int = 0, limit: int = 100_000
    ) -> list[JournalRecord]:
        rows = await self._db.all(
            "stats.records_of_kind", {"kind": kind, "after_seq": after_seq, "limit": limit}
        )
        return [journal_record(r) for r in rows]

    async def running_by_owner(self) -> dict[Owner, int]:
        """How many running rows each owner holds (the database's view, not the key's)."""
        rows = await self._db.all("stats.running_by_owner")
        return {
            Owner(r["owner_host"], int(r["owner_pid"]), r["owner_nonce"]): int(r["n"]) for r in rows
        }

    async def now_ms(self) -> int:
        """Database time (``runfleet.now_ms()``), the one clock the fleet agrees on."""
        row = await self._db.one("stats.db_now")
        assert row is not None
        return int(row["now_ms"])
