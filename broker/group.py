"""Group commit for producers: concurrent single admissions share one round trip.

While one batch is being admitted, the enqueues that arrive wait for it and then go
together as the next batch (at most ``limit`` runs). A lone caller waits for nothing
but one turn of the event loop, so sequential enqueues cost what they did; under
concurrency (a hundred tasks enqueueing at once) the hundred share one statement
pipeline and one stream write instead of paying one each.

Each caller gets its own outcome: the flush returns one result per run, a value or an
exception, and only that caller sees it. A flush that raises (the database gone for
the whole retry budget) fails every run of its batch, as it would have failed each.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    """Batches of ``Item`` flushed by ``flush(items, key)``; one batch per key at a time.

    ``key`` separates what cannot share a flush (a producer's ``at_front`` runs go to
    another stream lane). Flushes run in a task of their own, in a fresh context: a
    batch never runs inside one caller's context (its transaction, its cancellation).
    """

    def __init__(
        self,
        flush: Callable[[list[Item], Hashable], Awaitable[Sequence[Result | Exception]]],
        *,
        limit: int = 500,
    ) -> None:
        self._flush = flush
        self._limit = limit
        self._waiting: dict[Hashable, list[tuple[Item, asyncio.Future[Result]]]] = {}
        self._flushing: dict[Hashable, asyncio.Task[None]] = {}

    async def submit(self, item: Item, key: Hashable = None) -> Result:
        """Admit ``item`` with whatever else arrives meanwhile; its own result or error."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((item, future))
        if key not in self._flushing:
            task = asyncio.create_task(self._drain(key), context=contextvars.Context())
            self._flushing[key] = task
        return await future

    async def _drain(self, key: Hashable) -> None:
        try:
            await asyncio.sleep(0)  # callers started in the same turn join the first batch
            while waiting := self._waiting.get(key):
                batch, self._waiting[key] = waiting[: self._limit], waiting[self._limit :]
                await self._settle(batch, key)
        finally:  # no await from the last check to here: a later submit starts a new task
            self._flushing.pop(key, None)
            for _item, future in self._waiting.pop(key, []):
                future.cancel()  # only when this task itself was cancelled (loop shutdown)

    async def _settle(
        self, batch: list[tuple[Item, asyncio.Future[Result]]], key: Hashable
    ) -> None:
        results: Sequence[Result | Exception]
        try:
            results = await self._flush([item for item, _future in batch], key)
        except asyncio.CancelledError:
            for _item, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # every caller of the batch gets it
            results = [exc] * len(batch)
        for (_item, future), result in zip(batch, results, strict=True):
            if future.done():  # its caller was cancelled; the run may still be admitted
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def drain(self) -> None:
        """Wait for every batch in flight (before closing what the flush uses)."""
        while self._flushing:
            await asyncio.gather(*self._flushing.values(), return_exceptions=True)
