"""Every sweep read is an index scan bounded by its batch, whatever sits in the table.

The table is filled with every kind of row a sweep must *not* read (settled, fresh,
untimed, not yet due, delayed) around the ones it must, then each named sweep query
runs under EXPLAIN ANALYZE with a batch of 8: it must be an index scan (never a
sequential or bitmap scan), read at most the batch, and discard nothing by filter.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store.queries import q
from runfleet.store.sweeps import MAX_KEY, MIN_KEY

N = 2000
BATCH = 8

# (id prefix, rows, column -> SQL expression over the series value g and the time t)
KINDS: list[tuple[str, int, dict[str, str]]] = [
    ("done", 4 * N, {"status": "'completed'"}),
    ("stale", N, {"status": "'running'", "heartbeat_at_ms": "t - 3600000 + g"}),
    ("fresh", N, {"status": "'running'", "heartbeat_at_ms": "t + 3600000 + g"}),
    ("rel", N, {"status": "'suspended'", "waiting_reason": "'released'"}),
    ("due", N, {"status": "'suspended'", "waiting_reason": "'timer'",
                "waiting_wake_at_ms": "t - 1000000 + g"}),
    ("later", N, {"status": "'suspended'", "waiting_reason": "'timer'",
                  "waiting_wake_at_ms": "t + 1000000 + g"}),
    ("event", N, {"status": "'suspended'", "waiting_reason": "'event'"}),
    ("quar", N, {"status": "'suspended'", "waiting_reason": "'quarantine'",
                 "waiting_wake_at_ms": "t - 2000000 + g"}),
    ("delayed", N, {"status": "'pending'", "waiting_reason": "'timer'",
                    "waiting_wake_at_ms": "t + 1000000 + g", "created_at_ms": "t - 3000000 + g"}),
    ("pend", N, {"status": "'pending'"}),
    ("cancel", N, {"status": "'pending'", "cancel_requested_at_ms": "t"}),
    ("woken", N, {"status": "'suspended'"}),
    ("dead", N, {"status": "'running'", "heartbeat_at_ms": "t + 3600000",
                 "state": "jsonb_build_object('deadline_ms', t - 1000000 + g)"}),
    ("alive", N, {"status": "'running'", "heartbeat_at_ms": "t + 3600000",
                  "state": "jsonb_build_object('deadline_ms', t + 1000000 + g)"}),
]  # fmt: skip

START: dict[str, Any] = {"after_ms": MIN_KEY, "after_id": "", "after_name": "", "limit": BATCH}

# query -> (parameters, the index it must scan)
QUERIES: dict[str, tuple[dict[str, Any], str]] = {
    "sweeps.stale_running": ({"stale_after_ms": 1000}, "runs_stale_running_idx"),
    "sweeps.parked_released": ({}, "runs_released_idx"),
    "sweeps.due_waits": ({}, "runs_due_wait_idx"),
    "sweeps.due_clocks": ({}, "clocks_due_idx"),
    "sweeps.deadline_passed": ({}, "runs_deadline_idx"),
    "sweeps.pending_cancellations": ({}, "runs_cancel_pending_idx"),
    "sweeps.runnable_suspended": ({"older_than_ms": 0}, "runs_runnable_suspended_idx"),
    "sweeps.pending_runs": (
        {"older_than_ms": 0, "flow": None, "through_ms": MAX_KEY, "through_id": ""},
        "runs_runnable_pending_idx",
    ),
    "sweeps.pending_tail": ({"older_than_ms": 0, "flow": None}, "runs_runnable_pending_idx"),
}


def _insert(prefix: str, rows: int, columns: dict[str, str]) -> LiteralString:
    values = {
        "id": f"'{prefix}-' || lpad(g::text, 6, '0')",
        "flow": "'f.x'",
        "queue": "'q'",
        "lineage_id": f"'{prefix}-' || g",
        "created_at_ms": "t - 1000000 + g",
        "updated_at_ms": "t - 1000000 + g",
        "epoch": "1",
        **columns,
    }
    if columns["status"] == "'running'":
        values |= {"owner_host": "'h'", "owner_pid": "1", "owner_nonce": "'n'"}
    names, exprs = ", ".join(values), ", ".join(values.values())
    sql = (
        f"INSERT INTO runfleet.runs ({names}) SELECT {exprs} FROM generate_series(1, {rows}) g,"
        " (SELECT runfleet.now_ms() AS t) now"
    )
    return sql


CLOCKS: LiteralString = """
INSERT INTO runfleet.clocks (run_id, name, deferred_name, due_at_ms, completed_at_ms)
SELECT 'clock-' || lpad(g::text, 6, '0'), 'c', 'd',
       t + CASE g %% 3 WHEN 0 THEN -1000000 ELSE 1000000 END + g,
       CASE WHEN g %% 3 = 1 THEN t END
  FROM generate_series(1, 3 * %(n)s) g, (SELECT runfleet.now_ms() AS t) now
"""


@pytest.fixture
async def filled(database_url: str) -> str:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for prefix, rows, columns in KINDS:
            await conn.execute(_insert(prefix, rows, columns))
        await conn.execute(CLOCKS, {"n": N})
        # Autovacuum's steady state: statistics and the visibility map both current.
        await conn.execute("VACUUM ANALYZE runfleet.runs")
        await conn.execute("VACUUM ANALYZE runfleet.clocks")
    return database_url


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if "Relation Name" in plan else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


async def _explain(url: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {q(name)}", params)
        row = await cur.fetchone()
        assert row is not None
        plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
        return plan


EQUIVALENT: dict[str, set[str]] = {
    "sweeps.pending_runs": {"runs_status_created_idx"},
    "sweeps.pending_tail": {"runs_status_created_idx"},
}
"""Other indexes whose scan is as bounded for that read (the plan choice follows statistics)."""


@pytest.mark.parametrize("name", sorted(QUERIES))
async def test_sweep_reads_are_index_scans_bounded_by_the_batch(filled: str, name: str) -> None:
    extra, index = QUERIES[name]
    async with await psycopg.AsyncConnection.connect(filled) as conn:
        now = (await (await conn.execute("SELECT runfleet.now_ms()")).fetchone() or (0,))[0]
    # From the start, and from past every eligible row: what follows (fresh leases, waits
    # and clocks not yet due) must end the scan at the index bound, not be read and filtered.
    for cursor in (START, {**START, "after_ms": now}):
        plan = await _explain(filled, name, {**cursor, **extra})
        scans = [s for s in _scans(plan) if s["Relation Name"] in ("runs", "clocks")]
        assert scans, f"{name}: no scan of runs/clocks in {plan}"
        for scan in scans:
            assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (name, scan)
            # The planner may serve the pending read from the (status, created) index
            # as well: either is bounded, which the row counts below still prove.
            allowed = {index} | EQUIVALENT.get(name, set())
            assert scan["Index Name"] in allowed, (name, scan["Index Name"])
            limit = 1 if name == "sweeps.pending_tail" else BATCH
            if scan["Index Name"] != index:
                # Served by (status, created) with an incremental sort on id, the scan
                # reads one row past the batch to close the last created-at group.
                limit += 1
            assert scan["Actual Rows"] <= limit, (name, scan["Actual Rows"])
            assert scan.get("Rows Removed by Filter", 0) == 0, (name, scan)
    first = await _explain(filled, name, {**START, **extra})
    assert first["Actual Rows"] == (1 if name == "sweeps.pending_tail" else BATCH), name
