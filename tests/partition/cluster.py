"""The fleet of a partition scenario: hosts A and B, their workers, the store, the ledger.

Host A (2 processes x 6 slots) has room to spare, host B (2 x 2) is the one partitioned
or frozen. Every wait has a deadline; ``close`` heals every link and kills every worker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import JournalRecord, RunStatus
from tests.partition.hosts import HostWorkers
from tests.partition.net import Topology

VICTIM = "b"
A_PROCESSES, A_CONCURRENCY = 2, 6
A_SLOTS = A_PROCESSES * A_CONCURRENCY
"""At least as many as a scenario admits before the cut: whatever B holds then, A has
that many slots free, so a takeover never waits for a busy survivor's slot."""


def timing(settings: Settings) -> Settings:
    """Short but realistic lease timings for every process of the scenario."""
    return settings.model_copy(
        update={"heartbeat_interval": 0.5, "stale_after": 3.0, "sweep_interval": 0.5}
    )


def now_ms() -> float:
    return time.time() * 1000


class Cluster:
    """Hosts A and B with their workers, a producer, and the scenario's ledger."""

    def __init__(self, topo: Topology, settings: Settings, store: Store, ledger: Path) -> None:
        self.topo = topo
        self.settings = settings
        self.store = store
        self.ledger = ledger
        self.hosts: dict[str, HostWorkers] = {}
        self.keep_logs = True
        """Worker logs stay on disk (paths in the report) unless the scenario passed."""

    async def start(self) -> None:
        self.hosts["a"] = HostWorkers(
            self.topo.hosts["a"], self.settings, processes=A_PROCESSES, concurrency=A_CONCURRENCY
        )
        self.hosts[VICTIM] = HostWorkers(self.topo.hosts[VICTIM], self.settings, concurrency=2)
        for host in self.hosts.values():
            await host.wait_started()

    def close(self) -> None:
        self.topo.heal()
        for host in self.hosts.values():
            host.close()
            if not self.keep_logs:
                host.discard_log()

    async def owned_by(self, host: str, run_ids: Sequence[str]) -> list[str]:
        rows = await self.store.runs.get_many(list(run_ids))
        return [
            r.id
            for r in rows
            if r.status is RunStatus.RUNNING and r.owner and r.owner.host_id == f"host-{host}"
        ]

    async def settled(self, run_ids: Sequence[str]) -> bool:
        rows = await self.store.runs.get_many(list(run_ids))
        return len(rows) == len(run_ids) and all(r.status.terminal for r in rows)

    async def journals(self, run_ids: Sequence[str]) -> dict[str, list[JournalRecord]]:
        return {run: await self.store.journal.records(run) for run in run_ids}
