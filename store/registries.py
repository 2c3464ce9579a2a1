"""rq's job registries, queue list and dependency gate, read from run rows
(store/sql/registries.sql).

rq keeps each registry as a Redis sorted set beside the job hashes; here each one is a
query of ``runfleet.runs`` (the one source of truth), narrowed in Python where the answer
depends on other runs' statuses (a dependent is deferred until its dependencies are met).
``rqface.registries`` is the rq-shaped face; workers use ``dependencies_met`` for the gate
and ``work_left`` for ``runfleet worker --burst``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.types.json import Jsonb

from runfleet.store.types import RunStatus

if TYPE_CHECKING:
    from runfleet.store import Store


class RegistryKind(StrEnum):
    """rq's job registries (``registries.by_status`` narrows by it)."""

    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    DEFERRED = "deferred"
    SCHEDULED = "scheduled"
    CANCELED = "canceled"


MARKERS = (
    "deleted",
    "dependents_released",
    "canceled",
    "removed_from_dependencies",
    "stopped",
)


class RegistryEntry(NamedTuple):
    """One run in a registry (``Registries.ids``)."""

    rq_id: str
    """The id an rq user reads (a requeued round answers with its lineage's)."""
    wake_at_ms: int | None
    """The timer's due time (the scheduled registry's), or None."""


class DependencyGate(NamedTuple):
    """``Registries.dependencies_met``'s answer."""

    met: bool
    """rq's ``dependencies_are_met``."""
    broken: bool
    """Some dependency can no longer meet it (failed or cancelled: only a requeue can)."""


class _Answer(NamedTuple):
    """What the dependency gate reads of the round that answers for a dependency."""

    status: RunStatus
    dependents_released: bool
    """Cancelled (or its cancel requested) with ``enqueue_dependents``: met at once."""
    canceled: bool
    """Failed by a cancel (rq's canceled): never met by ``allow_failure``."""


def _depends_on(row: Any) -> list[str]:
    ids = row["depends_on"]
    return [str(run_id) for run_id in ids] if isinstance(ids, list) else []


def _gate(
    answers: dict[str, _Answer], run_ids: Sequence[str], allow_failure: bool
) -> DependencyGate:
    """``dependencies_met``'s rule over answers already read."""
    met, broken = True, False
    for run_id in run_ids:
        answer = answers.get(run_id)
        if answer is None or answer.dependents_released:
            continue
        status = answer.status
        if status is RunStatus.COMPLETED:
            continue
        if status is RunStatus.FAILED and allow_failure and not answer.canceled:
            continue
        met = False
        broken = broken or status in (RunStatus.FAILED, RunStatus.CANCELLED)
    return DependencyGate(met, broken)


class Registries:
    def __init__(self, store: Store) -> None:
        self._db = store.db

    async def ids(
        self, kind: RegistryKind, queue: str, scopes: Sequence[str], limit: int = 100_000
    ) -> list[RegistryEntry]:
        """The queue's runs in registry ``kind``, oldest first."""
        kind = RegistryKind(kind)  # ValueError for a name that is no registry
        params = {
            "kind": kind.value,
            "queue": queue,
            "scopes": Jsonb(sorted(scopes)),
            "limit": limit,
        }
        rows = await self._db.all("registries.by_status", params)
        if kind not in (RegistryKind.STARTED, RegistryKind.DEFERRED):
            return [RegistryEntry(r["rq_id"], r["wake_at_ms"]) for r in rows]
        met = await self._met(rows)
        return [
            RegistryEntry(r["rq_id"], r["wake_at_ms"])
            for r, ok in zip(rows, met, strict=True)
            if ok == (kind is RegistryKind.STARTED)
        ]

    async def queued(self, queue: str, scopes: Sequence[str], limit: int = 100_000) -> list[str]:
        """rq's queue contents, oldest first: a dependent only once its dependencies are met."""
        params = {"queue": queue, "scopes": Jsonb(sorted(scopes)), "limit": limit}
        rows = await self._db.all("registries.queued", params)
        return [r["rq_id"] for r, ok in zip(rows, await self._met(rows), strict=True) if ok]

    async def _met(self, rows: Sequence[Any]) -> list[bool]:
        """Whether each row's ``depends_on`` is met; every dependency of every row read in
        one statement (a listing of many dependents is two statements, not one a run)."""
        wanted = [_depends_on(r) for r in rows]
        answers = await self._answers([run_id for ids in wanted for run_id in ids])
        return [
            _gate(answers, ids, r["allow_failure"]).met for r, ids in zip(rows, wanted, strict=True)
        ]

    async def queues(self, scopes: Sequence[str]) -> list[str]:
        rows = await self._db.all("registries.queues", {"scopes": Jsonb(sorted(scopes))})
        return [r["queue"] for r in rows]

    async def mark(self, key: str, run_ids: Sequence[str]) -> int:
        if key not in MARKERS:
            raise ValueError(f"no marker {key!r}")
        return len(await self._db.all("registries.mark", {"key": key, "ids": list(run_ids)}))

    async def mark_queue_deleted(self, queue: str, scopes: Sequence[str]) -> int:
        params = {"queue": queue, "scopes": Jsonb(sorted(scopes))}
        return await self._db.execute("registries.mark_queue_deleted", params)

    async def dependents(self, run_id: str) -> list[str]:
        return [r["id"] for r in await self._db.all("registries.dependents", {"id": run_id})]

    async def dependencies_met(
        self, run_ids: Sequence[Any], allow_failure: bool = False
    ) -> DependencyGate:
        """Whether rq's ``dependencies_are_met``, and whether some dependency can no
        longer meet it.

        Met when every dependency completed, or failed with ``allow_failure``, or was
        deleted (rq: a missing dependency is met), or was cancelled with
        ``cancel(enqueue_dependents=True)`` (met at once, before the cancel settles).
        A cancelled one otherwise, or a failed one without ``allow_failure``, is not met
        (rq leaves the dependent deferred) and "broken": only a requeue of it can change
        that.
        """
        ids = [str(run_id) for run_id in run_ids]
        return _gate(await self._answers(ids), ids, allow_failure)

    async def _answers(self, run_ids: Sequence[str]) -> dict[str, _Answer]:
        """What answers for each id, in one statement (``registries.answering_many``); an id
        nothing answers for (absent, hidden, deleted by rq's delete) is left out."""
        if not run_ids:
            return {}
        rows = await self._db.all("registries.answering_many", {"ids": sorted(set(run_ids))})
        return {
            r["origin"]: _Answer(
                RunStatus(r["status"]), bool(r["dependents_released"]), bool(r["canceled"])
            )
            for r in rows
            if r["following"] is None and not r["deleted"]
        }

    async def work_left(
        self, queues: Sequence[str], horizon_ms: int, excluding: Sequence[str] = ()
    ) -> AsyncIterator[str]:
        """The runs (at most 200) a burst worker of ``queues`` may still have to run, but
        ``excluding``; one at a time, as the caller decides from the first which it can
        execute (the dependents' dependencies are all read in one statement)."""
        params = {"queues": list(queues), "horizon_ms": horizon_ms, "excluding": list(excluding)}
        rows = await self._db.all("registries.work_left", params)
        for r, ok in zip(rows, await self._met(rows), strict=True):
            if ok:
                yield r["id"]
