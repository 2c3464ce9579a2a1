"""Recovery first: a SIGKILLed worker's runs start before a 1,000-run backlog (real processes)."""

from __future__ import annotations

import signal

import pytest

import tests.fleet.recovery_flows as rec
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import JournalRecord, RunStatus
from tests.fleet.procs import Spawn
from tests.support.polling import until

pytestmark = pytest.mark.chaos

BACKLOG = 1000


async def test_recovery_first_with_backlog(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    survivors = [spawn(flows="tests.fleet.recovery_flows", concurrency=8) for _ in range(2)]
    victim = spawn(flows="tests.fleet.recovery_flows", concurrency=8)
    for proc in (*survivors, victim):
        await proc.wait_started()
    await queue.enqueue_many([EnqueueSpec(rec.nap, (50 + (i * 7) % 51,)) for i in range(BACKLOG)])

    async def victim_holds() -> int:
        owned = await store.stats.running_by_owner()
        return sum(n for owner, n in owned.items() if owner.pid == victim.pid)

    async def victim_busy() -> bool:
        return await victim_holds() >= 4

    await until(victim_busy, 20, "the victim to hold runs")
    killed_at = await store.stats.now_ms()
    victim.signal(signal.SIGKILL)
    await victim.wait_exit()
    held = await victim_holds()
    assert held >= 1
    pending = (await store.stats.status_counts()).get(RunStatus.PENDING, 0)
    assert pending > BACKLOG // 2, f"the backlog drained too early to prove anything ({pending})"

    async def stolen() -> list[JournalRecord] | None:
        steals = await store.stats.records_of_kind(Kind.STOLEN_AND_ACTIVATED)
        return steals if len(steals) >= held else None

    steals = await until(stolen, 60, f"{held} runs to be re-activated")
    delays = sorted(r.at_ms - killed_at for r in steals)
    budget_ms = settings.stale_after_ms + 3000
    assert delays[-1] <= budget_ms, f"re-activation delays {delays} ms, budget {budget_ms} ms"
    # Busy survivors and a backlog still there: some never-started run starts after the
    # last steal (none would if the takeovers had waited for the backlog to drain).
    last = max(r.seq for r in steals)

    async def first_start_after_last_steal() -> bool:
        found = await store.stats.records_of_kind(Kind.CLAIMED_AND_ACTIVATED, after_seq=last)
        return any(r.payload.get("epoch") == 1 for r in found)

    await until(first_start_after_last_steal, 60, "a backlog run to start after the steals")
