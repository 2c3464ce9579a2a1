"""A batch admission (runfleet.admit, 0023) joins, records and answers as it always did.

0023 answers the new rows from the INSERT's RETURNING and probes only the ids it did not
insert; these pin the cases that path could get wrong: a batch of new runs and runs that
exist, one of which has no ``created`` record (a raw producer INSERT, which row security
admits), a repeated id, and a re-admission of the whole batch (a retry after an unseen
commit) that writes no second record.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runfleet.store.queries import q


def _batch(ids: list[str], source: str) -> dict[str, Any]:
    runs: list[dict[str, Any]] = [
        {"id": i, "flow": "f.x", "queue": "q", "state": {"scopes": []},
         "payload": '{"args": [], "kwargs": {}}', "lineage_id": i, "round_ordinal": 0,
         "previous_round_id": None, "delay_until_ms": None, "timeout_ms": None,
         "priority": None, "dedup_key": None}
        for i in ids
    ]  # fmt: skip
    records = [
        {"id": i, "source_seq": n + 1, "record": {"n": n}, "digest": "d", "queue": "q",
         "dedup_key": None}
        for n, i in enumerate(ids)
    ]  # fmt: skip
    return {"runs": Jsonb(runs), "records": Jsonb(records), "kind": "created",
            "source_id": source}  # fmt: skip


async def test_a_batch_of_new_and_existing_runs_is_joined_and_recorded_once(
    database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        # An existing run with its record, and one without (a raw INSERT).
        await conn.execute(q("admit.batch"), _batch(["had", "had-2"], "first"))
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
            " updated_at_ms, priority, payload)"
            " VALUES ('raw', 'f.x', 'q', 'pending', 'raw', 1, 1, 0,"
            ' \'{"args": [], "kwargs": {}}\')'
        )
        ids = ["new-a", "had", "raw", "new-b", "new-a"]  # new-a twice: joins its first
        answer = await (await conn.execute(q("admit.batch"), _batch(ids, "second"))).fetchall()
        assert sorted((r["id"], r["inserted"]) for r in answer) == [
            ("had", False), ("new-a", True), ("new-b", True), ("raw", False)
        ]  # fmt: skip
        by_id = {r["id"]: r for r in answer}
        assert by_id["new-a"]["status"] == "pending" and by_id["new-a"]["priority"] == 0
        assert by_id["raw"]["created_at_ms"] == 1  # the existing row, as it is

        async def records() -> list[tuple[str, str, int]]:
            rows = await (
                await conn.execute(
                    "SELECT run_id, source_id, source_seq FROM runfleet.journal"
                    " WHERE kind = 'created' ORDER BY run_id, source_id, source_seq"
                )
            ).fetchall()
            return [(r["run_id"], r["source_id"], r["source_seq"]) for r in rows]

        expected = [
            ("had", "first", 1), ("had-2", "first", 2),
            ("new-a", "second", 1), ("new-a", "second", 5),  # as before 0023: per record
            ("new-b", "second", 4), ("raw", "second", 3),  # the raw run gets its record
        ]  # fmt: skip
        assert await records() == expected
        # The whole batch again (a retry that finds its own commit): all joined, no record.
        again = await (await conn.execute(q("admit.batch"), _batch(ids, "third"))).fetchall()
        assert sorted((r["id"], r["inserted"]) for r in again) == [
            ("had", False), ("new-a", False), ("new-b", False), ("raw", False)
        ]  # fmt: skip
        assert await records() == expected
