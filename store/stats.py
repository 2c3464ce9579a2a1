"""Fleet-wide reads: how many runs are where, whether any rule was broken, and the clock.

Each read exists once: operators (``runfleet fleet``, the dashboard), the demo,
benchmarks and schedules all count and tell time here.
"""

from __future__ import annotations

from dataclasses import dataclass

from runfleet.store.db import Database
from runfleet.store.rows import journal_record
from runfleet.store.types.journal import JournalRecord
from runfleet.store.types.run import Owner, RunStatus


@dataclass(frozen=True)
class QueueOverview:
    """One queue's line of ``runfleet info``: open runs by what they wait for, and the
    failed runs no requeue has replaced yet."""

    queue: str
    pending: int
    scheduled: int
    running: int
    waiting: int
    dead: int
    failed: int


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

    async def queue_overview(self) -> list[QueueOverview]:
        """Every queue with an open or unretried failed run (the caller's rows only)."""
        rows = await self._db.all("stats.queue_overview")
        return [
            QueueOverview(
                queue=str(r["queue"]),
                pending=int(r["pending"]),
                scheduled=int(r["scheduled"]),
                running=int(r["running"]),
                waiting=int(r["waiting"]),
                dead=int(r["dead"]),
                failed=int(r["failed"]),
            )
            for r in rows
        ]

    async def now_ms(self) -> int:
        """Database time (``runfleet.now_ms()``), the one clock the fleet agrees on."""
        row = await self._db.one("stats.db_now")
        assert row is not None
        return int(row["now_ms"])
