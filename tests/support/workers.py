"""A worker run in the test's own event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runfleet.worker.process import Worker


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """``worker`` started (its ``run`` task, once it reads); stopped hard and awaited on the
    way out, whatever the test did with it."""
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.started.wait(), 10)
    try:
        yield task
    finally:
        worker.stop(hard=True)
        await asyncio.wait_for(task, 15)
