"""A cancel committed but not yet delivered when a shutdown or a lapse interrupts the body:
the row decides, not the cause in memory. The release finds the cancel request (in its own
transaction, fenced by owner and epoch) and the run is cancelled where it ran, compensations
first, instead of being handed to another worker as released."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import tests.fleet.flows as flows
import tests.flows.flows as f
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, records, running_on
from tests.fleet.tcpproxy import FreezableProxy
from tests.fleet.test_lease_lapse import via
from tests.support.polling import until


async def _settled(store: Store, run_id: str) -> RunStatus | None:
    row = await store.runs.get(run_id)
    return row.status if row is not None and row.status.terminal else None


async def test_a_cancel_not_yet_delivered_at_a_hard_stop_is_cancelled_here(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    # A renewal every 5 s: the cancel below is committed, but the heartbeat poll that
    # would deliver it does not come before the two signals (and nothing publishes it).
    a = spawn(heartbeat_interval=5.0, stale_after=30.0, grace_period=30.0)
    await a.wait_started()
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.compensated_sleep, str(ledger), 60_000)
    started = await until(lambda: running_on(store, run.id, a.pid), 10, "the run on A")
    await until(lambda: store.steps.of_run(run.id), 10, "its step to be recorded")
    await store.lifecycle.request_cancel(run.id)  # durable, not published
    a.signal(signal.SIGTERM)
    await asyncio.sleep(0.05)  # two signals sent back to back may reach it as one
    a.signal(signal.SIGTERM)
    assert await a.wait_exit(20) == 0
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.CANCELLED, row
    assert row.epoch == started.epoch  # closed at the epoch it ran at: never re-claimed
    assert await records(store, run.id, "interrupt-released") == []
    (closed,) = await records(store, run.id, "interrupted")
    assert closed.payload["found_at_release"] == "shutdown"
    undone = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(u["at"], u["pid"]) for u in undone] == [("compensated", a.pid)]


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[FreezableProxy]:
    parts = urlsplit(settings.database_url)
    proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()


async def test_a_cancel_committed_during_a_lapse_is_cancelled_when_the_database_answers(
    settings: Settings, queue: AsyncQueue, store: Store, proxy: FreezableProxy
) -> None:
    """The lapse interrupts the body while the database is unreachable; the cancel lands
    meanwhile (from a producer that reaches it). When the worker's release gets through it
    still holds the fence: it cancels the run, compensations included, and releases none."""
    slow = settings.model_copy(
        update={
            "database_url": via(settings.database_url, proxy.port),
            "heartbeat_interval": 0.5,
            "stale_after": 3.0,  # lapse after 2 s, fail-stop after 2.25 s
        }
    )
    w = Worker(slow, concurrency=2)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(w.started.wait(), 10)
    try:
        t = f"lapse-{id(proxy)}"
        run = await queue.enqueue(f.busy_compensating, t)
        started = await until(lambda: running_on(store, run.id, None), 10, "the run to start")
        await until(lambda: store.steps.of_run(run.id), 10, "its step to be recorded")
        proxy.freeze()
        await until(lambda: _lapsed(w), 10, "the lease to lapse")
        await store.lifecycle.request_cancel(run.id)  # a producer with its own link
        proxy.thaw()
        assert await until(lambda: _settled(store, run.id), 15, "the run to settle") == (
            RunStatus.CANCELLED
        )
    finally:
        proxy.thaw()
        w.stop(hard=True)
        await asyncio.wait_for(task, 15)
    row = await store.runs.get(run.id)
    assert row is not None and row.epoch == started.epoch
    assert await records(store, run.id, "interrupt-released") == []
    (closed,) = await records(store, run.id, "interrupted")
    assert closed.payload["found_at_release"] == "lease-lapsed"
    assert f.CALLS[f"undo:{t}-1"] == 1


async def _lapsed(w: Worker) -> bool:
    return w.lease.lapsed
