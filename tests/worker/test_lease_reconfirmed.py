"""The end of a lapse, as the journal tells it: fenced, and with the gap it closed.

A process cut off from Postgres lapses; meanwhile another steals one of its runs. When the
database answers again, the renewal that ends the lapse journals ``lease-reconfirmed`` in
its own statement, only on the runs it renewed at the epoch this process holds them at —
never on the stolen one — with how long the lease went unconfirmed; the lapse release of
the run it still held records the same gap.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import NewRun, Owner, RunRow
from runfleet.worker import flow
from runfleet.worker.driver import Driver
from runfleet.worker.lease import Lease, LeaseGate, LeaseSignals
from tests.fleet.tcpproxy import FreezableProxy
from tests.fleet.test_lease_lapse import via
from tests.store.helpers import db_now
from tests.support.polling import until

HELD = threading.Event()


@flow(name="tests.worker.held_in_thread")
def held_in_thread(ctx: Any) -> str:
    """A body no interrupt stops (a thread): its run stays in memory through the lapse."""
    HELD.wait(60)
    return "done"


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[FreezableProxy]:
    parts = urlsplit(settings.database_url)
    proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()


async def test_the_renewal_ending_a_lapse_journals_only_the_runs_still_held(
    settings: Settings, store: Store, proxy: FreezableProxy
) -> None:
    HELD.clear()
    a_owner = Owner.for_this_process(settings.host_id)
    lease_store = await Store.open(
        settings.model_copy(update={"database_url": via(settings.database_url, proxy.port)}),
        source_id=f"{a_owner.key}/lease",
        min_size=1,
        max_size=2,
        statement_timeout_ms=int(settings.renew_timeout * 1000),
    )
    gate = LeaseGate(settings)
    a = Driver(store, a_owner, settings, lease=gate)
    signals = LeaseSignals()
    lease = Lease(lease_store, a, a_owner, settings, gate=gate, signals=signals)
    b = Driver(store, Owner.for_this_process(settings.host_id), settings)
    drives: list[asyncio.Task[Any]] = []
    try:
        assert await lease.tick() is not None  # the gate opens
        for run_id in ("stolen", "kept"):
            await store.admission.create(NewRun(id=run_id, flow="tests.worker.held_in_thread"))
            drives.append(asyncio.create_task(a.drive(run_id)))
        await until(lambda: _executing(a, {"stolen", "kept"}), 10, "both bodies to run on A")
        lease.start()
        proxy.freeze()  # A's lease connection: every byte stalls, as in a partition
        await signals.lapsed.wait(5)
        held = await store.runs.get("stolen")
        assert held is not None and held.heartbeat_at_ms is not None
        await until(
            lambda: db_now(store),
            10,
            "A's lease on the run to turn stale by database time",
            accept=lambda now: now > (held.heartbeat_at_ms or 0) + settings.stale_after_ms,
        )
        drives.append(asyncio.create_task(b.drive("stolen")))  # stolen, then its body blocks
        await until(lambda: _owned_by(store, "stolen", b.owner), 10, "B to steal the run")
        proxy.thaw()
        await signals.reconfirmed.wait(10)
        await until(lambda: _kinds(store, "kept", "lease-reconfirmed"), 10, "the record")
        HELD.set()
        await asyncio.wait_for(asyncio.gather(*drives), 15)  # all A wrote is written

        assert await _kinds(store, "stolen", "lease-reconfirmed") == []
        (reconfirmed,) = await _kinds(store, "kept", "lease-reconfirmed")
        assert reconfirmed.payload["owner"] == a_owner.key
        assert reconfirmed.payload["epoch"] == 1
        gap = reconfirmed.payload["unconfirmed_ms"]
        assert gap >= settings.lapse_after * 1000, reconfirmed.payload
        assert gap == gate.last_gap_ms
        (released,) = await _kinds(store, "kept", "interrupt-released")
        assert released.payload["cause"] == "lease-lapsed"
        assert released.payload["unconfirmed_ms"] == gap
        steal = (await _kinds(store, "stolen", "stolen-and-activated"))[0]
        late = [r for r in await store.journal.records("stolen") if r.seq > steal.seq]
        assert all(not r.source_id.startswith(a_owner.key) for r in late), late
        done = await store.runs.get("stolen")
        assert done is not None and done.status.value == "completed"
    finally:
        HELD.set()
        proxy.thaw()
        lease.stop()
        await lease.wait_stopped(5)
        for task in drives:
            task.cancel()
        await asyncio.gather(*drives, return_exceptions=True)
        await lease_store.close()


async def _executing(driver: Driver, run_ids: set[str]) -> bool:
    return run_ids <= driver.executing


async def _owned_by(store: Store, run_id: str, owner: Owner) -> RunRow | None:
    row = await store.runs.get(run_id)
    return row if row is not None and row.owner == owner else None


async def _kinds(store: Store, run_id: str, kind: str) -> list[Any]:
    return [r for r in await store.journal.records(run_id) if r.kind == kind]
