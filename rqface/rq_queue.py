"""The sync ``Queue``'s reads and writes for rq's surface (store/registries.py), each one
call on the queue's loop: queue contents, the queue list, markers, dependencies."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from runfleet.producer.queue import AsyncQueue
from runfleet.store.registries import Registries


class RqReads:
    """``queue``: the sync ``Queue``'s loop queue; ``call``: runs a coroutine on its loop."""

    def __init__(self, queue: AsyncQueue, call: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._queue = queue
        self._call = call

    def _run(self, call: Any) -> Any:
        q = self._queue

        async def go() -> Any:
            registries = Registries(q.store)
            return await q.session.available(lambda: call(registries))

        return self._call(go())

    def queued(self) -> list[str]:
        q = self._queue
        return self._run(lambda r: r.queued(q.name, q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def queues(self) -> list[str]:
        q = self._queue
        return self._run(lambda r: r.queues(q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def mark(self, key: str, run_ids: Sequence[str]) -> int:
        if not run_ids:
            return 0
        return self._run(lambda r: r.mark(key, list(run_ids)))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def mark_queue_deleted(self) -> int:
        q = self._queue
        return self._run(lambda r: r.mark_queue_deleted(q.name, q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def dependents(self, run_id: str) -> list[str]:
        return self._run(lambda r: r.dependents(run_id))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def dependencies_met(self, ids: Sequence[str], allow_failure: bool) -> bool:
        return bool(self._run(lambda r: r.dependencies_met(list(ids), allow_failure)).met)
