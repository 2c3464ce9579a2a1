"""An in-process worker and producer over the test's own database and Redis prefix."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import tests.flows.flows  # noqa: F401 - registers the test flows
from broker import AsyncQueue
from store import Store
from store.config import Settings
from store.types import RunRow
from tests.fleet.procs import until
from worker.process import Worker


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[Worker]:
    w = Worker(settings, queues=["default"], concurrency=8)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(w.started.wait(), 10)
    try:
        yield w
    finally:
        w.stop(hard=True)
        await asyncio.wait_for(task, 15)


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[AsyncQueue]:
    async with AsyncQueue("default", settings=settings) as q:
        yield q


async def parked(store: Store, run_id: str, reason: str, timeout: float = 10) -> RunRow:
    async def check() -> RunRow | None:
        row = await store.runs.get(run_id)
        return row if row and row.waiting and row.waiting.reason == reason else None

    return await until(check, timeout, f"run {run_id} to park on {reason}")
