"""Step attempts that timed out (``ctx.step(..., timeout=)``), as ``explain`` tells them."""

from __future__ import annotations

from dataclasses import dataclass

from runfleet.store.db import Database


@dataclass(frozen=True, slots=True)
class TimedOutAttempt:
    key: str
    attempt: int
    started_at_ms: int
    finished_at_ms: int | None
    error: str


class StepTimeouts:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def of_run(self, run_id: str) -> list[TimedOutAttempt]:
        rows = await self._db.all("timeouts.timed_out", {"run_id": run_id})
        return [
            TimedOutAttempt(
                r["key"],
                int(r["attempt"]),
                int(r["started_at_ms"]),
                r["finished_at_ms"],
                r["error"],
            )
            for r in rows
        ]
