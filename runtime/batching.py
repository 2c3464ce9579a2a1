"""Group commit: calls that become ready together share one round trip.

A caller ``submit``s one item and awaits its own answer. Items submitted while a
flush is in flight (or in the same event-loop turn as the first) go out together
in the next flush, so an idle process pays no added latency and a busy one pays one
statement, transaction or pipeline per batch instead of per item. Each caller learns
only its own outcome: the flush answers item by item, and an error of the whole
flush reaches every caller of that batch (a caller that retries submits again, into
a later batch).

One implementation serves both sides: producers' concurrent enqueues (``AsyncQueue``,
one instance per stream lane; ``ThreadGroupCommit`` below is its twin for the threads
sharing one sync ``Queue``) and the worker's settlements, step records and Redis
hints (``worker/settle.py``, ``worker/bookkeeping.py``, ``worker/outbox.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("runfleet.batching")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]]


class GroupCommit(Generic[T, R]):
    """Batch ``submit`` calls into ``flush(items) -> answers`` (one answer per item, in order).

    An answer that is an exception is raised to its own caller only; so is an
    ``isolate`` error, which makes the batch retry item by item to find its owner.
    Flushes run in a task of their own, in a fresh context: a batch never runs inside
    one caller's context (its transaction, its log fields, its cancellation).
    """

    def __init__(
        self,
        flush: Flush[T, R],
        *,
        max_items: int = 256,
        name: str = "batch",
        isolate: tuple[type[Exception], ...] = (),
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self._flush = flush
        self._max = max_items
        self._name = name
        self._isolate = isolate
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """``item``'s own answer once the batch it joined has been flushed."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(
                self._run(), name=f"group-commit:{self._name}", context=contextvars.Context()
            )
        return await future

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # callers ready in this same turn join the batch
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                answers = await self._answers([item for item, _ in batch])
                if len(answers) != len(batch):
                    raise RuntimeError(f"{self._name}: {len(answers)} answers for {len(batch)}")
            except asyncio.CancelledError:
                for _, future in batch + self._pending:
                    if not future.done():
                        future.cancel()
                self._pending = []
                raise
            except Exception as exc:  # every caller of this batch gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):  # this item's own error
                    future.set_exception(answer)
                else:
                    future.set_result(answer)

    async def drain(self) -> None:
        """Wait until every item submitted so far has its answer (before closing what
        the flush uses)."""
        while self._runner is not None and not self._runner.done():
            await asyncio.wait([self._runner])

    async def _answers(self, items: list[T]) -> Sequence[R | BaseException]:
        """The flush's answers; when it raises an ``isolate`` error for a batch of several
        (one item's data was refused, say), each item is flushed alone instead, so only
        the item at fault gets the error."""
        try:
            return await self._flush(items)
        except self._isolate:
            if len(items) == 1:
                raise
        answers: list[R | BaseException] = []
        for item in items:
            try:
                answers.extend(await self._flush([item]))
            except self._isolate as exc:
                answers.append(exc)
        return answers


class Coalesce(Generic[T]):
    """Fire-and-forget items sent together: one ``send(items)`` per event-loop turn.

    For hints whose loss is covered elsewhere (stream acks, settled notifications,
    wake publications): ``send`` is expected to log its own failures; an exception
    that escapes it is logged here and never reaches the callers.
    """

    def __init__(
        self, send: Callable[[list[T]], Awaitable[object]], *, name: str = "coalesce"
    ) -> None:
        self._send = send
        self._name = name
        self._pending: list[T] = []
        self._runner: asyncio.Task[None] | None = None

    def add(self, item: T) -> None:
        self._pending.append(item)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(
                self._run(), name=f"coalesce:{self._name}", context=contextvars.Context()
            )

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(0)
            batch, self._pending = self._pending, []
            try:
                await self._send(batch)
            except Exception:
                log.exception("coalesce.send_failed", extra={"batch": self._name})

    async def drain(self) -> None:
        """Wait until everything added so far has been sent (or failed)."""
        while self._runner is not None and not self._runner.done():
            await asyncio.shield(self._runner)


SyncFlush = Callable[[Sequence[T]], Sequence[R | BaseException]]


class _Slot(Generic[T, R]):
    """One thread's item, and what its thread is woken with: its answer, or the lead."""

    __slots__ = ("answer", "error", "item", "lead", "ready")

    def __init__(self, item: T) -> None:
        self.item = item
        self.ready = threading.Event()
        self.lead = False
        self.answer: R | None = None
        self.error: BaseException | None = None


class ThreadGroupCommit(Generic[T, R]):
    """``GroupCommit`` for threads: a leader flushes, the threads that queued meanwhile follow.

    A thread that ``submit``s while fewer than ``flights`` flushes are in flight leads:
    it calls ``flush`` at once with its own item, in its own thread, with no window to
    wait out. A thread that submits while ``flights`` flushes are in flight queues up
    and blocks; when a flush returns, each thread of its batch is woken with its own
    answer, and the first thread still queued is woken to lead the next batch, with
    everything queued by then. A lone thread therefore pays a lock, never a hop or a
    wait. (More than one flight measured slower for a sync ``Queue``'s admissions on
    two cores: smaller batches, the same Python.)
    As with ``GroupCommit``, an answer that is an exception is raised to its own caller
    only, and an error of the whole flush reaches every caller of that batch.

    ``flush`` runs in a fresh context (not the leading caller's: its transaction, its
    log fields). A forked child starts with no batch in flight (a flush in flight in
    the parent at the fork has no thread in the child to finish it).
    """

    def __init__(
        self,
        flush: SyncFlush[T, R],
        *,
        max_items: int = 256,
        flights: int = 1,
        name: str = "batch",
    ) -> None:
        if max_items < 1 or flights < 1:
            raise ValueError("max_items and flights must be >= 1")
        self._flush = flush
        self._max = max_items
        self._flights = flights
        self._name = name
        self._lock = threading.Lock()
        self._pending: list[_Slot[T, R]] = []
        self._leaders = 0
        self._pid = os.getpid()
        self.flushes = 0
        """Batches flushed so far (a figure for tests and benchmarks)."""

    def submit(self, item: T) -> R:
        """``item``'s own answer once the batch it joined has been flushed."""
        slot: _Slot[T, R] = _Slot(item)
        if self._pid != os.getpid():  # a forked child: the parent's threads are not here
            self._lock, self._pending, self._leaders = threading.Lock(), [], 0
            self._pid = os.getpid()
        with self._lock:
            lead = self._leaders < self._flights
            if lead:
                self._leaders += 1
            else:
                self._pending.append(slot)
        if not lead:
            slot.ready.wait()
            lead = slot.lead
        if lead:
            self._lead(slot)
        if slot.error is not None:
            raise slot.error
        return slot.answer  # type: ignore[return-value]  # set with no error: an R

    def _lead(self, own: _Slot[T, R]) -> None:
        """Flush ``own`` item and those queued, answer them, pass the lead on."""
        with self._lock:
            taken = self._max - 1
            batch, self._pending = [own, *self._pending[:taken]], self._pending[taken:]
        answers: Sequence[R | BaseException] = ()
        failed: BaseException | None = None
        try:
            self.flushes += 1
            answers = contextvars.Context().run(self._flush, [slot.item for slot in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"{self._name}: {len(answers)} answers for {len(batch)}")
        except BaseException as exc:  # every caller of this batch gets the error
            failed = exc
        finally:
            with self._lock:
                if self._pending:  # the lead passes on: the count of flights is unchanged
                    successor = self._pending.pop(0)
                    successor.lead = True
                    successor.ready.set()
                else:
                    self._leaders -= 1
        for i, slot in enumerate(batch):
            answer = failed if failed is not None else answers[i]
            if i and failed is not None and not isinstance(failed, Exception):
                # an interrupt of the leading thread is its own; the others learn their
                # items' fate is unknown (a retry with the same id joins what committed)
                answer = RuntimeError(f"{self._name}: the batch was interrupted ({failed!r})")
            if isinstance(answer, BaseException):
                slot.error = answer
            else:
                slot.answer = answer
            if slot is not own:
                slot.ready.set()
