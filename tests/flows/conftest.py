"""An in-process worker and producer over the test's own database and Redis prefix."""

from __future__ import annotations

import tests.flows.flows  # noqa: F401 - registers the test flows
from runfleet.store import Store
from runfleet.store.types import RunRow
from tests.support.polling import until


async def parked(store: Store, run_id: str, reason: str, timeout: float = 10) -> RunRow:
    async def check() -> RunRow | None:
        row = await store.runs.get(run_id)
        return row if row and row.waiting and row.waiting.reason == reason else None

    return await until(check, timeout, f"run {run_id} to park on {reason}")
