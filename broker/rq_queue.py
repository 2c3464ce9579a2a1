"""The sync ``Queue``'s reads and writes for rq's surface (store/registries.py), each one
call on the queue's loop: queue contents, the queue list, markers, dependencies, inline runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runfleet.store.registries import Registries

if TYPE_CHECKING:
    from runfleet.broker.inline import InlineJob
    from runfleet.broker.queue import EnqueueSpec
    from runfleet.broker.sync import Queue


class RqReads:
    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def _run(self, call: Any) -> Any:
        q = self._queue._async

        async def go() -> Any:
            registries = Registries(q.store)
            return await q.session.available(lambda: call(registries))

        return self._queue._call(go())

    def queued(self) -> list[str]:
        q = self._queue._async
        return self._run(lambda r: r.queued(q.name, q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def queues(self) -> list[str]:
        q = self._queue._async
        return self._run(lambda r: r.queues(q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def mark(self, key: str, run_ids: Sequence[str]) -> int:
        if not run_ids:
            return 0
        return self._run(lambda r: r.mark(key, list(run_ids)))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def mark_queue_deleted(self) -> int:
        q = self._queue._async
        return self._run(lambda r: r.mark_queue_deleted(q.name, q.scopes))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def dependents(self, run_id: str) -> list[str]:
        return self._run(lambda r: r.dependents(run_id))  # type: ignore[no-any-return]  # _run answers the loop call's Any

    def dependencies_met(self, ids: Sequence[str], allow_failure: bool) -> bool:
        return bool(self._run(lambda r: r.dependencies_met(list(ids), allow_failure)).met)

    def run_inline(self, spec: EnqueueSpec) -> InlineJob:
        from runfleet.broker.inline import run_inline

        new = self._queue._call(self._queue._async._new_run(spec, inline=True))
        return run_inline(self._queue, new)
