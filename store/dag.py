"""The run DAG: one durable edge per (child, parent), cycle-checked where it is inserted,
and the hand-over of a settled child's outcome to the parents that await it."""

from __future__ import annotations

import json
from collections.abc import Sequence

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
from runfleet.store.db import Database
from runfleet.store.errors import FlowCycleDetected
from runfleet.store.journal import Journal
from runfleet.store.rows import edge, run_row
from runfleet.store.types.dag import EdgeExisting, EdgeRecorded, ParentEdge
from runfleet.store.types.run import RunRow


def child_outcome(child: RunRow) -> str:
    """What a parent's ``child:<id>`` deferred holds once the child settled, as JSON text.

    Text, not a value: the deferred keeps it verbatim (a ``json`` column), so the result's
    floats stay floats when the parent reads it back.
    """
    return json.dumps(
        {
            "status": child.status.value,
            "result": child.result,
            "error": None if child.error is None else child.error.to_json(),
            "handed_off_to": child.handed_off_to,
        }
    )


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
            recorded = jr.ParentRecorded(parent=parent_id)
            await self._journal.record(child_id, recorded)
            return EdgeRecorded(edge(row))

    async def notify_parents(
        self, children: Sequence[RunRow], *, only_parent: str | None = None
    ) -> dict[str, list[RunRow]]:
        """Hand settled children's outcomes to their parents; per child, the parents it woke.

        Every parent of every round of each child's lineage gets its ``child:<id>``
        deferred (first writer wins) and is woken if parked on it. A parent that has
        itself settled gets nothing: a settled run takes nothing, as ``complete_deferred``
        answers. ``only_parent`` limits the hand-over to one parent (a diamond's parent
        that joins a child after it settled).
        """
        if not children:
            return {}
        rows = await self._db.all(
            "waits.notify_parents",
            {
                "children": [child.id for child in children],
                "values": [child_outcome(child) for child in children],
                "only_parent": only_parent,
            },
        )
        woke: dict[str, list[RunRow]] = {}
        for row in rows:
            woke.setdefault(str(row["woken_by"]), []).append(run_row(row))
        return woke

    async def deliver_settled(self, child_id: str, parent_id: str) -> list[RunRow]:
        """A parent joining ``child_id`` gets the outcome of each round already settled.

        Called after the parent's edge is recorded, in its transaction: the lineage's rows
        are locked (``FOR SHARE``) first, so a settlement still in flight commits before
        this reads them (and is handed over here), or waits for this transaction and then
        sees the new edge itself. Either way the joining parent is never left waiting on a
        child whose outcome was handed out before it joined. Answers the parent's row if
        it was parked on one of those rounds and is now woken.
        """
        rounds = [run_row(r) for r in await self._db.all("dag.lock_lineage", {"id": child_id})]
        settled = [r for r in rounds if r.status.terminal]
        woke = await self.notify_parents(settled, only_parent=parent_id)
        return [row for rows in woke.values() for row in rows]

    async def parents(self, child_id: str) -> list[ParentEdge]:
        return [edge(r) for r in await self._db.all("dag.parents", {"id": child_id})]

    async def children(self, parent_id: str) -> list[ParentEdge]:
        return [edge(r) for r in await self._db.all("dag.children", {"id": parent_id})]

    async def remove_edges(self, run_id: str) -> int:
        """Drop every edge touching a run (the cleanup half of deleting a run)."""
        return await self._db.execute("dag.remove_edges", {"id": run_id})
