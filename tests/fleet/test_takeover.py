"""Takeover with real processes: SIGKILL, SIGSTOP, graceful SIGTERM (real Postgres + Redis)."""

from __future__ import annotations

import signal

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from tests.fleet.procs import Spawn, records, running_on, writes_after_steal
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def test_sigkill_mid_run_is_stolen_with_evidence(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    a = spawn()
    await a.wait_started()
    # Long enough that B starts before the body ends on A, on a loaded 2-core box too.
    run = await queue.enqueue(flows.sleepy, 8000, "k")
    await until(lambda: running_on(store, run.id, a.pid), 10, "run to start on A")
    b = spawn()
    await b.wait_started()
    a.signal(signal.SIGKILL)
    # Recovery budget: stale_after + two sweep ticks, then the 8 s body runs again.
    result = await run.result(timeout=settings.stale_after + 2 * settings.sweep_interval + 8 + 5)
    assert result["pid"] == b.pid
    (steal,) = await records(store, run.id, "stolen-and-activated")
    previous = Owner.parse(str(steal.payload["previous_owner"]))
    assert previous is not None and previous.pid == a.pid
    assert steal.payload["probe"] == "same-host-pid-dead"
    assert steal.payload["lease_age_ms"] > settings.stale_after_ms
    assert len(await records(store, run.id, "transitioned")) == 1


async def test_sigstopped_owner_is_stolen_and_never_settles(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    a = spawn()
    await a.wait_started()
    run = await queue.enqueue(flows.sleepy, 8000, "s")  # outlasts B's start on A
    first = await until(lambda: running_on(store, run.id, a.pid), 10, "run to start on A")
    b = spawn()
    await b.wait_started()
    a.signal(signal.SIGSTOP)
    # Generous: a loaded 2-core CI machine starves B now and then (the bench times recovery).
    stolen = await until(lambda: running_on(store, run.id, b.pid), 40, "B to steal the run")
    assert stolen.epoch > first.epoch
    a.signal(signal.SIGCONT)
    assert (await run.result(timeout=20))["pid"] == b.pid
    (steal,) = await records(store, run.id, "stolen-and-activated")
    # A stopped process still has its pid; its key expired, so the pid no longer vouches.
    assert steal.payload["probe"] == "same-host-pid-reused"
    (settled,) = await records(store, run.id, "transitioned")
    assert stolen.owner is not None and settled.source_id == stolen.owner.key
    late = await writes_after_steal(store, run.id, steal, first)
    assert late == [], "the old owner wrote after the steal"


async def test_graceful_sigterm_releases_to_another_worker_fast(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    a = spawn(grace_period=0.3)
    await a.wait_started()
    run = await queue.enqueue(flows.sleepy, 4000, "g")
    await until(lambda: running_on(store, run.id, a.pid), 10, "run to start on A")
    b = spawn()
    await b.wait_started()
    a.signal(signal.SIGTERM)
    assert await a.wait_exit() == 0
    await until(lambda: running_on(store, run.id, b.pid), 5, "B to take the released run")
    (released,) = await records(store, run.id, "interrupt-released")
    activations = await records(store, run.id, "claimed-and-activated")
    resumed = [r for r in activations if r.seq > released.seq]
    assert resumed, "the released run was not re-activated"
    assert resumed[0].at_ms - released.at_ms < 1000
    assert (await run.result(timeout=10))["pid"] == b.pid
