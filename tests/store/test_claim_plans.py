"""A single-run claim reads its one row by primary key however deep the backlog behind it.

The statistics a backlog meets are stale by nature: a burst of admissions into a table
the planner last analyzed when it held a few settled runs (autovacuum's analyze runs
only after 10 % of the table changed). With them, a claim whose WHERE clause states a
pending partial index's predicate ("pending, not waiting, not claimed") took that index
for empty and walked all of it for the one id it wanted: `claim_if_fresh`'s priority
look-ahead read 100,000 entries (~210 ms a claim at a 100,000-run backlog, a semi join
driven by a scan of runs_ready_priority_idx) and `claim_and_activate` scanned
runs_runnable_pending_idx for its id (docs/backlog.md). Every scan of `runs` in these
statements must be a bounded index scan: a handful of buffers, never one proportional to
the pending rows.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store.queries import q

PENDING = 30_000
MAX_BUFFERS = 16
"""A primary-key probe touches 3-5 buffers; the walks this test guards against touched
~90 (claim_and_activate) and ~90,000 (claim_if_fresh) at this depth."""

BASE: dict[str, Any] = {
    "owner_key": "owner-x",
    "journal_kind": "claimed-and-activated",
    "source_id": "plans-test",
    "source_seq": 1,
    "host": "h",
    "pid": 1,
    "nonce": "n",
    "serves": None,
}

FRESH: dict[str, Any] = {
    "status": "pending",
    "exp_owner_host": None,
    "exp_owner_pid": None,
    "exp_owner_nonce": None,
    "exp_heartbeat_at_ms": None,
    "exp_epoch": 0,
}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "claim_if_fresh with the priority look-ahead": (
        "runs.claim_if_fresh",
        {"flow": "f.x", "ahead_flows": ["f.x"]},
    ),
    "claim_if_fresh without look-ahead": (
        "runs.claim_if_fresh",
        {"flow": "f.x", "ahead_flows": None},
    ),
    "claim_and_activate": ("runs.claim_and_activate", FRESH),
    "claim": ("runs.claim", FRESH),
}


@pytest.fixture
async def stale_backlog(database_url: str) -> str:
    """A few settled runs analyzed, then a burst of pending ones the planner never saw."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # Autovacuum off on this database's table: the statistics stay what the burst found.
        await conn.execute("ALTER TABLE runfleet.runs SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
            " updated_at_ms) SELECT 'done-' || g, 'f.x', 'q', 'completed', 'done-' || g, 1, 1"
            " FROM generate_series(1, 100) g"
        )
        await conn.execute("ANALYZE runfleet.runs")
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
            " updated_at_ms) SELECT 'p-' || lpad(g::text, 6, '0'), 'f.x', 'q', 'pending',"
            " 'p-' || g, t + g, t + g FROM generate_series(1, %(n)s) g,"
            " (SELECT runfleet.now_ms() AS t) now",
            {"n": PENDING},
        )
    return database_url


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Relation Name") == "runs" and "Index Name" in plan else []
    found += [plan] if plan.get("Node Type") in ("Seq Scan", "Bitmap Heap Scan") else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_claim_probes_its_row_whatever_the_backlog(stale_backlog: str, case: str) -> None:
    name, extra = CASES[case]
    explain = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {q(name)}"
    async with await psycopg.AsyncConnection.connect(stale_backlog, row_factory=dict_row) as conn:
        # A first call in a session also plans queue_free_slots' own statements (catalog
        # reads counted against the node that calls it); a worker's connection is warm.
        async with conn.transaction(force_rollback=True):
            await conn.execute(explain, {**BASE, **extra, "id": "p-000001"})
        # A run in the middle of the backlog: older ones are ahead of it in every pending
        # index, newer ones behind it.
        async with conn.transaction(force_rollback=True):
            cur = await conn.execute(explain, {**BASE, **extra, "id": f"p-{PENDING // 2:06d}"})
            row = await cur.fetchone()
    assert row is not None
    plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
    scans = _scans(plan)
    assert scans, f"{case}: no scan of runs in {plan}"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (case, scan["Node Type"])
        touched = scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0)
        assert touched <= MAX_BUFFERS, (case, scan["Index Name"], touched)
        assert scan["Actual Rows"] * scan["Actual Loops"] <= 1, (case, scan["Index Name"])
