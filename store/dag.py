"""The run DAG: one durable edge per (child, parent), cycle-checked where it is inserted."""

from __future__ import annotations

from store import validate
from store.db import Database
from store.errors import FlowCycleDetected
from store.journal import Journal, Kind
from store.rows import edge
from store.types import EdgeExisting, EdgeRecorded, ParentEdge


class Dag:
    def __init__(self, db: Database, journal: Journal) -> None:
        self._db = db
        self._journal = journal

    async def record_parent(self, child_id: str, parent_id: str) -> EdgeRecorded | EdgeExisting:
        """Record ``parent_id -> child_id`` unless it would close a cycle.

        Inserts serialize on a transaction-scoped advisory lock and the ancestor
        walk runs after the insert in the same transaction, so of two transactions
        that together close a cycle exactly one fails. A failure raises
        FlowCycleDetected(path) and rolls the savepoint back: no trace remains.
        """
        validate.identifier("child_id", child_id)
        validate.identifier("parent_id", parent_id)
        if child_id == parent_id:
            raise FlowCycleDetected([child_id, child_id])
        params = {"child": child_id, "parent": parent_id}
        async with self._db.transaction():
            await self._db.one("dag.lock_dag")
            row = await self._db.one("dag.insert_edge", params)
            if row is None:
                existing = await self._db.one("dag.get_edge", params)
                assert existing is not None, "edge vanished"
                return EdgeExisting(edge(existing))
            cycle = await self._db.one("dag.ancestor_path", params)
            if cycle is not None:
                raise FlowCycleDetected(list(cycle["path"]))
            await self._journal.record(child_id, Kind.PARENT_RECORDED, {"parent": parent_id})
            return EdgeRecorded(edge(row))

    async def parents(self, child_id: str) -> list[ParentEdge]:
        return [edge(r) for r in await self._db.all("dag.parents", {"id": child_id})]

    async def children(self, parent_id: str) -> list[ParentEdge]:
        return [edge(r) for r in await self._db.all("dag.children", {"id": parent_id})]

    async def remove_edges(self, run_id: str) -> int:
        """Drop every edge touching a run (the cleanup half of deleting a run)."""
        return await self._db.execute("dag.remove_edges", {"id": run_id})
