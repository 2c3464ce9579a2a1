"""An admission's plans made on a young database read by key once the tables have grown.

A producer's connection plans ``runfleet.admit`` (a batch) and ``runfleet.admit_one`` (a
single enqueue) at its first calls, often while the journal and ``runs`` hold a handful
of rows, and keeps those plans until the tables' statistics change. A database that
only producers write has no sweeper to refresh them (``runfleet.analyze_grown`` is the
workers'), and autovacuum counts a table once a minute at best. Planned as sequential
scans, the batch's check for runs already recorded read the whole journal on every call
(2 ms a batch of ten in the threaded benchmark, growing as producers admitted 12,000
runs). Both functions plan with sequential scans off (migration 0034): what they read
of the grown tables stays a probe per run. The transaction's own counters say what the
statements read (no timing). The batch is the case that failed: ``admit``'s plans are
generic, made once. ``admit_one``'s are custom (planned at each call from the table's
current size), so the single admission passed before 0034 too; it is here so that a
change to its plans cannot bring the scans back unseen.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Created, NewRun
from tests.store.helpers import committed_rows_counted

YOUNG = 4  # admissions while the tables are young: their plans are made then
MEASURED = 4
BATCH = 8
GROWN = 3000  # runs, each with its record, added after the plans were made

FILL = """
WITH admitted AS (
    INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, round_ordinal,
                               created_at_ms, updated_at_ms)
    SELECT 'old-' || g, 'f.x', 'q', 'pending', '{}'::jsonb, 'old-' || g, 0, t, t
      FROM generate_series(1, %(n)s) g, (SELECT runfleet.now_ms() AS t) now
    RETURNING id, created_at_ms
)
INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest, at_ms)
SELECT a.id, 'created', 'fill', row_number() OVER (ORDER BY a.id), '{}'::jsonb, 'd',
       a.created_at_ms
  FROM admitted a
"""


@pytest.fixture(autouse=True)
async def _no_autovacuum(database_url: str) -> None:
    """The test decides when the tables are counted: an autovacuum after FILL would
    refresh the plans in its place."""
    for table in ("runs", "journal"):
        await _admin(database_url, f"ALTER TABLE runfleet.{table} SET (autovacuum_enabled = false)")


async def _admin(url: str, sql: Any, params: dict[str, Any] | None = None) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(sql, params)


async def _reads(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, int]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT relname, seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'runfleet' AND relname IN ('runs', 'journal')"
    )
    return {
        row["relname"]: {k: int(v) for k, v in row.items() if k != "relname"}
        for row in await cur.fetchall()
    }


def _news(prefix: str, n: int) -> list[NewRun]:
    return [NewRun(id=f"{prefix}-{i}", flow="tests.flow") for i in range(n)]


async def _admit(store: Store, news: list[NewRun]) -> None:
    if len(news) == 1:
        outcomes: list[Any] = [await store.admission.create(news[0])]  # runfleet.admit_one
    else:
        outcomes = await store.admission.admit_each(news)  # runfleet.admit
    assert all(isinstance(o, Created) for o in outcomes), outcomes


@pytest.mark.parametrize("batch", [BATCH, 1], ids=["batch", "single"])
async def test_admissions_planned_young_read_the_grown_tables_by_key(
    database_url: str, settings: Settings, batch: int
) -> None:
    await _admin(database_url, "ANALYZE runfleet.runs")
    await _admin(database_url, "ANALYZE runfleet.journal")
    store = await Store.open(
        settings.model_copy(update={"prepare_threshold": 0}), min_size=1, max_size=1
    )
    try:
        for i in range(YOUNG):  # the plans are made on the young tables
            await _admit(store, _news(f"young{i}", batch))
        await _admin(database_url, FILL, {"n": GROWN})
        await committed_rows_counted(database_url, "runfleet.journal", GROWN)
        async with store.transaction() as conn:
            # Before and after, in one transaction: the counters also hold what the
            # connection's earlier transactions did and has not yet reported.
            before = await _reads(conn)
            for i in range(MEASURED):
                await _admit(store, _news(f"grown{i}", batch))
            after = await _reads(conn)
    finally:
        await store.close()
    read = {t: {k: after[t][k] - before[t][k] for k in after[t]} for t in ("runs", "journal")}
    assert all(r["seq_scan"] == 0 for r in read.values()), read
    assert all(
        r["seq_tup_read"] + r["idx_tup_fetch"] <= MEASURED * batch * 4 for r in read.values()
    ), read
