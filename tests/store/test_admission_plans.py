"""An admission reads its own runs and nothing else, however deep the backlog.

`runfleet.admit` (SQL block `admit.batch`) runs here beside thousands of open runs, with
and without deduplication keys, and the transaction's own statistics
(`pg_stat_xact_user_tables`, `pg_stat_get_xact_tuples_returned` per index: counters of
this transaction alone, no timing) say what it read: no sequential scan, no scan of the
status index, index tuples in proportion to the batch. It once answered the dedup holders
in a query OR'd with the id lookup, which read every open run on every admission
(migration 0021).

And no row written to `runs` runs a SQL function the planner could not inline: the expiry
index's expression once did, for every insert and every non-HOT update (0021).
"""

from __future__ import annotations

import uuid
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runfleet.store.queries import q

OPEN = 3000  # open runs around the admission: as many again as a batch could explain
KEYED = 1000  # of them holding a dedup key

FILL = """
INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms, updated_at_ms,
                           priority, dedup_key)
SELECT 'old-' || g, 'f.x', 'q', 'pending', 'old-' || g, t + g, t + g, 0,
       CASE WHEN g <= %(keyed)s THEN 'key-' || g END
  FROM generate_series(1, %(open)s) g, (SELECT runfleet.now_ms() AS t) now
"""


@pytest.fixture
async def backlog(database_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(FILL, {"open": OPEN, "keyed": KEYED})
        await conn.execute("VACUUM ANALYZE runfleet.runs")
    return database_url


def _params(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [
        {
            "id": r["id"], "flow": "f.x", "queue": "q", "state": {"scopes": []},
            "payload": '{"args": [], "kwargs": {}}', "lineage_id": r["id"], "round_ordinal": 0,
            "previous_round_id": None, "delay_until_ms": None, "timeout_ms": None,
            "priority": None, "dedup_key": r.get("dedup_key"),
        }
        for r in runs
    ]  # fmt: skip
    records = [
        {"id": r["id"], "source_seq": i + 1, "record": {}, "digest": "d", "queue": "q",
         "dedup_key": r.get("dedup_key")}
        for i, r in enumerate(runs)
    ]  # fmt: skip
    return {
        "runs": Jsonb(rows),
        "records": Jsonb(records),
        "kind": "created",
        "source_id": f"plans-{uuid.uuid4().hex[:8]}",
    }


def _one(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``admit.one``'s parameters for a batch of one (the single enqueue's statement)."""
    assert len(runs) == 1
    batch = _params(runs)
    row, record = batch["runs"].obj[0], batch["records"].obj[0]
    return {**row, **record, "state": Jsonb(row["state"]), "record": Jsonb(record["record"]),
            "kind": batch["kind"], "source_id": batch["source_id"]}  # fmt: skip


async def _admit_and_count(
    url: str, runs: list[dict[str, Any]], entry: str = "batch"
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
    """Admit in one transaction; its answer, and what it read of `runs`, before commit."""
    params = _one(runs) if entry == "one" else _params(runs)
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        async with conn.transaction():
            answer = await (await conn.execute(q(f"admit.{entry}"), params)).fetchall()
            table = await (
                await conn.execute(
                    "SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch"
                    " FROM pg_stat_xact_user_tables"
                    " WHERE schemaname = 'runfleet' AND relname = 'runs'"
                )
            ).fetchone()
            indexes = await (
                await conn.execute(
                    "SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) AS read"
                    " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE i.indrelid = 'runfleet.runs'::regclass"
                    " AND pg_stat_get_xact_tuples_returned(c.oid) > 0"
                )
            ).fetchall()
    assert table is not None
    return answer, table, {i["relname"]: i["read"] for i in indexes}


async def test_an_admission_without_keys_reads_only_its_own_rows(backlog: str) -> None:
    runs = [{"id": f"new-{i}"} for i in range(3)]
    answer, table, indexes = await _admit_and_count(backlog, runs)
    assert sorted((r["id"], r["inserted"]) for r in answer) == [
        ("new-0", True), ("new-1", True), ("new-2", True)
    ]  # fmt: skip
    assert table["seq_scan"] == 0, table
    assert set(indexes) <= {"runs_pkey"}, indexes  # never the status or the dedup index
    # The id probes: the insert's arbiter check, the records' visibility, the answer.
    assert table["idx_tup_fetch"] <= 3 * len(runs), table


async def test_an_admission_with_a_key_probes_its_holder(backlog: str) -> None:
    runs = [{"id": "new-keyed", "dedup_key": "key-7"}, {"id": "new-free", "dedup_key": "fresh"}]
    answer, table, indexes = await _admit_and_count(backlog, runs)
    by_id = {r["id"]: r for r in answer}
    assert set(by_id) == {"new-free", "old-7"}  # the free key admitted, the held one answered
    assert by_id["new-free"]["inserted"] and not by_id["old-7"]["inserted"]
    assert table["seq_scan"] == 0, table
    assert "runs_status_created_idx" not in indexes, indexes
    assert indexes.get("runs_open_dedup_idx", 0) <= 2 * len(runs), indexes
    assert table["idx_tup_fetch"] <= 4 * len(runs), table


async def test_a_single_admission_reads_only_its_own_row(backlog: str) -> None:
    answer, table, indexes = await _admit_and_count(backlog, [{"id": "new-one"}], "one")
    assert [(r["id"], r["inserted"]) for r in answer] == [("new-one", True)]
    assert table["seq_scan"] == 0, table
    assert set(indexes) <= {"runs_pkey"}, indexes
    assert table["idx_tup_fetch"] <= 3, table


async def test_a_single_admission_with_a_held_key_probes_its_holder(backlog: str) -> None:
    runs = [{"id": "new-keyed", "dedup_key": "key-7"}]
    answer, table, indexes = await _admit_and_count(backlog, runs, "one")
    assert [(r["id"], r["inserted"]) for r in answer] == [("old-7", False)]
    assert table["seq_scan"] == 0, table
    assert "runs_status_created_idx" not in indexes, indexes
    assert indexes.get("runs_open_dedup_idx", 0) <= 2, indexes
    assert table["idx_tup_fetch"] <= 4, table
    fresh, _table, _indexes = await _admit_and_count(
        backlog, [{"id": "new-fresh", "dedup_key": "fresh"}], "one"
    )
    assert [(r["id"], r["inserted"]) for r in fresh] == [("new-fresh", True)]


async def test_the_batch_admission_is_not_planned_again_per_call(backlog: str) -> None:
    """PL/pgSQL kept a custom plan for each of runfleet.admit's statements, planned again on
    every call (for a one-element array it always looks cheaper than the generic plan),
    which cost more than executing them (docs/explanation/admission-path.md). With 0022 the
    plans are the generic ones from the first call: auto_explain prints the function's variable, not
    the call's values, in the index condition. (Timing is the bench's; this is the plan.)
    A custom plan would also hash the arrays a generic one searches linearly: 0023 keeps
    the generic plans and tests no membership in an array variable per row
    (``test_a_batch_admission_compares_in_proportion_to_its_size``)."""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(backlog, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        await conn.execute("SET auto_explain.log_level = notice")
        for i in range(8):
            await conn.execute(q("admit.batch"), _params([{"id": f"planned-{i}"}]))
    # The records' lookup by the visible ids (0023: the runs' own lookup is a probe per id
    # it did not insert, `r.id = m.id`, whose plan names no array either way).
    lookups = [
        n for n in notices if "FROM runfleet.journal j WHERE j.run_id = ANY (v_visible)" in n
    ]
    assert len(lookups) >= 8, notices
    assert all("journal_run_idx" in n for n in lookups), lookups  # an index probe
    assert not [n for n in lookups if "planned-" in n], lookups  # no call's values: generic
    probes = [n for n in notices if "FROM runfleet.runs r WHERE r.id = m.id" in n]
    assert len(probes) >= 8 and all("runs_pkey" in n for n in probes), probes


async def test_a_row_written_to_runs_calls_no_sql_function_per_row(backlog: str) -> None:
    """An index expression Postgres cannot inline is planned and run for every row written."""
    async with await psycopg.AsyncConnection.connect(backlog, row_factory=dict_row) as conn:
        await conn.execute("SET track_functions = 'all'")  # counts calls of un-inlined functions
        async with conn.transaction():
            await conn.execute(q("admit.batch"), _params([{"id": "counted"}]))
            await conn.execute(
                "UPDATE runfleet.runs SET status = 'completed',"
                " state = state || '{\"result_ttl\": 5}' WHERE id = 'counted'"
            )
            called = await (
                await conn.execute(
                    "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                    " WHERE schemaname = 'runfleet' AND funcname = 'run_expires_at_ms'"
                )
            ).fetchall()
            indexed = await (
                await conn.execute(
                    "SELECT id FROM runfleet.runs"
                    " WHERE runfleet.run_expires_at_ms(status, state, updated_at_ms) IS NOT NULL"
                )
            ).fetchall()
    assert called == [], called
    assert [r["id"] for r in indexed] == ["counted"]  # and the expression still says the TTL


OLD_EXPIRY: LiteralString = """
SELECT CASE WHEN ttl IS NULL THEN NULL
            WHEN ttl < 0 THEN 9223372036854775807
            ELSE at + (least(ttl, 3153600000) * 1000)::bigint END
  FROM (SELECT CASE WHEN jsonb_typeof(t) = 'number' THEN (t #>> '{}')::numeric END AS ttl
          FROM (SELECT CASE status WHEN 'completed' THEN state->'result_ttl'
                                   WHEN 'failed' THEN state->'failure_ttl' END AS t) s) v
"""
"""Migration 0010's body of run_expires_at_ms, the definition the inlinable one replaces."""


STATES = [
    {}, {"result_ttl": 5}, {"result_ttl": -1}, {"result_ttl": 0}, {"result_ttl": 1.5},
    {"result_ttl": "5"}, {"result_ttl": None}, {"result_ttl": 1e20}, {"failure_ttl": 7},
    {"failure_ttl": -3, "result_ttl": 2}, {"failure_ttl": [1]}, {"result_ttl": {"a": 1}},
    {"failure_ttl": 0.0001}, {"result_ttl": True}, {"failure_ttl": -0.5},
]  # fmt: skip
STATUSES = ["pending", "running", "suspended", "completed", "failed", "cancelled"]


async def test_the_inlinable_expiry_says_what_the_old_one_said(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "WITH cases(status, state, at) AS ("
            "  SELECT s, st, a FROM unnest(%(statuses)s::text[]) s,"
            "  unnest(%(states)s::jsonb[]) st, unnest(ARRAY[0, 1796168001123, NULL]::bigint[]) a)"
            " SELECT count(*), count(*) FILTER (WHERE"
            "   runfleet.run_expires_at_ms(c.status, c.state, c.at) IS DISTINCT FROM"
            "  (SELECT (" + OLD_EXPIRY + ")"
            "     FROM (SELECT c.status, c.state, c.at) x(status, state, at))),"
            " count(*) FILTER (WHERE runfleet.run_expires_at_ms(c.status, c.state, c.at)"
            "                  IS NOT NULL)"
            " FROM cases c",
            {"statuses": STATUSES, "states": [Jsonb(st) for st in STATES]},
        )
        assert await cur.fetchone() == (270, 0, 23)  # every case, none differs, some expire


async def test_a_batch_admission_compares_in_proportion_to_its_size(backlog: str) -> None:
    """No statement of runfleet.admit filters rows by membership in an array variable.

    In its generic plans an array variable is a parameter, which Postgres searches
    linearly per row (only a constant array is hashed): 0022's records filter
    (``b.id = ANY (v_visible) AND NOT b.id = ANY (v_recorded)``) made a batch of n runs
    do n * n comparisons, 1 ms a run in a batch of 8,000 (docs/explanation/admission-path.md).
    Read from the plans, not timed: every plan line that filters or joins by ``= ANY`` would be
    such a search (an index condition by ``= ANY`` is the index's probes, which stay)."""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(backlog, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        await conn.execute("SET auto_explain.log_level = notice")
        fresh = [{"id": f"wide-{i}"} for i in range(20)]
        again = [*fresh[:5], {"id": "old-1"}, {"id": "wide-new", "dedup_key": "key-9"}]
        for runs in (fresh, again):  # all new; then joined, a held key and one new
            answer = await (await conn.execute(q("admit.batch"), _params(runs))).fetchall()
            assert len(answer) == len(runs)
    plans = [n for n in notices if "runfleet.runs" in n or "runfleet.journal" in n]
    assert plans, notices
    searched = [
        line.strip()
        for plan in plans
        for line in plan.splitlines()
        if ("Filter:" in line or "Join Filter:" in line) and "= ANY" in line
    ]
    assert searched == [], searched
