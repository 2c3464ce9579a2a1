"""Sync bodies and sync steps never starve each other of threads."""

from __future__ import annotations

import asyncio

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from tests.fleet.procs import Spawn

pytestmark = pytest.mark.chaos


async def test_a_full_worker_of_sync_bodies_with_sync_steps_completes(
    settings: Settings, spawn: Spawn
) -> None:
    """12 slots of plain-def bodies each waiting on a sync step: 24 threads at once.

    asyncio's default pool has cpus + 4 threads (6 here): the bodies took them all
    and their steps waited for a thread forever, leases still renewed.
    """
    worker = spawn(concurrency=12)
    await worker.wait_started()
    async with AsyncQueue("default", settings=settings) as queue:
        runs = [await queue.enqueue(flows.sync_body_sync_step, 300) for _ in range(24)]
        results = await asyncio.gather(*(run.result(timeout=60) for run in runs))
    assert all(r["slept"] == 300 for r in results)
