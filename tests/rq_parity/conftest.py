"""A runfleet worker on a thread of its own, so synchronous producer code (rq-shaped)
can run in the test's thread while the worker executes the runs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from runfleet.store.config import Settings
from runfleet.worker.process import Worker


class ThreadWorker:
    def __init__(self, settings: Settings, queues: list[str]) -> None:
        self._settings = settings
        self._queues = queues
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadWorker:
        self._ready.clear()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(20), "worker did not start"
        return self

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._worker = Worker(self._settings, queues=self._queues, concurrency=4)
        task = asyncio.create_task(self._worker.run())
        await asyncio.wait_for(self._worker.started.wait(), 15)
        self._ready.set()
        await task

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._worker is None:
            return
        worker = self._worker
        self._loop.call_soon_threadsafe(lambda: worker.stop(hard=True))
        self._thread.join(20)
        assert not self._thread.is_alive(), "worker thread did not stop"
        self._thread = None


@pytest.fixture
def thread_worker(settings: Settings) -> Iterator[ThreadWorker]:
    """A worker on the ``default`` queue, not yet started (``.start()`` it when wanted)."""
    tw = ThreadWorker(settings, ["default"])
    try:
        yield tw
    finally:
        tw.stop()
