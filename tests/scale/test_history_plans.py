"""With a long history in the tables, every sweep still reads an index bounded by its batch.

A fleet that has run for months holds a great many settled runs and their journal
records; no sweep may read them. The database here holds that history (settled runs,
three journal records each: ``bench.history_runs``/``bench.history_journal``, the fill
``python -m bench fleet`` uses for its history case) around every kind of row a sweep
must and must not take (``tests/store/test_sweep_plans.KINDS``, plus stale and fresh
claims), vacuumed and analyzed as autovacuum would leave it. Each sweep query then runs
under EXPLAIN ANALYZE (retention's prune_batch inside a transaction rolled back); a
``Seq Scan`` over ``runfleet.runs`` or ``runfleet.journal`` anywhere in a plan fails,
with every plan printed.

Size: the target is 1,000,000 settled runs. Writing that and its 3,000,000 journal
records takes about a minute on a Postgres with fsync on (the suite's budget here is
~40 s), so the default is ``HISTORY_ROWS`` = 300,000 runs and 900,000 records;
``RUNFLEET_TEST_HISTORY_ROWS=1000000`` runs the full size. The statistics are real (the
fill is analyzed, not faked), and the verdict cannot flip between the two sizes in the
direction that matters: a bounded index scan costs the same whatever lies outside its
batch, while a sequential scan's cost grows with the table, so a plan that is an index
scan at 300,000 rows stays one at 1,000,000 — and a sequential scan at 300,000 is one
at any larger size too. Far smaller fills prove nothing: at 50,000 runs the planner
hashes the whole runs table for retention's relatives join, a plan it drops as the
table grows.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from runfleet.ops.servers.resolve import Endpoints, database_url_for
from runfleet.store.queries import q
from tests.store.test_sweep_plans import BATCH, CLOCKS, KINDS, NOW, QUERIES, START, N, _insert

HISTORY_ROWS = int(os.environ.get("RUNFLEET_TEST_HISTORY_ROWS", "300000"))
WATCHED = {"runs", "journal"}

CLAIMS: list[tuple[str, int, dict[str, str]]] = [
    ("stranded", N, {"status": "'pending'", "claim_host": "'h'", "claim_pid": "1",
                     "claim_nonce": "'n'", "claimed_at_ms": "t - 3600000 + g"}),
    ("claiming", N, {"status": "'pending'", "claim_host": "'h'", "claim_pid": "1",
                     "claim_nonce": "'n'", "claimed_at_ms": "t + 3600000 + g"}),
]  # fmt: skip

PRUNE: dict[str, Any] = {"after_ms": START["after_ms"], "after_id": "", "limit": 100}
"""Retention's batch from the start; ``before_ms``/``now_ms`` are the fill's database time
(every settled run is due)."""

# Every statement the sweeper and the retention pass issue against the run tables.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (name, {**START, **extra}) for name, (extra, _) in QUERIES.items()},
    "sweeps.stranded_claims": ("sweeps.stranded_claims", {"stale_after_ms": 1000, **START}),
    "retention.prune_batch/settled": ("retention.prune_batch", {**PRUNE, "scan": "settled"}),
    "retention.prune_batch/expiry": ("retention.prune_batch", {**PRUNE, "scan": "expiry"}),
}


@pytest.fixture(scope="module")
def history(services: Endpoints, template_database: str) -> Iterator[tuple[str, int]]:
    """The filled database's URL and its database time after the fill."""
    name = f"rf_hist_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.database_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_database)
            )
        )
    url = database_url_for(services.database_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            params = {"rows": HISTORY_ROWS, "flow": "f.x", "queue": "q"}
            conn.execute(q("bench.history_runs"), params)
            conn.execute(q("bench.history_journal"), {"rows": HISTORY_ROWS})
            for prefix, rows, columns in [*KINDS, *CLAIMS]:
                conn.execute(_insert(prefix, rows, columns))
            conn.execute(CLOCKS, {"n": N})
            for table in ("runs", "journal", "clocks"):
                conn.execute(sql.SQL("VACUUM ANALYZE runfleet.{}").format(sql.Identifier(table)))
            now = conn.execute("SELECT runfleet.now_ms()").fetchone()
            assert now is not None
        yield url, int(now[0])
    finally:
        with psycopg.connect(services.database_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explain(url: str, name: str, params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The executed plan (JSON) and its text form; writes are rolled back."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        explain: LiteralString = "EXPLAIN (ANALYZE, BUFFERS, FORMAT {}) "
        row = conn.execute(explain.format("JSON") + q(name), params).fetchone()
        assert row is not None
        conn.rollback()
        text = conn.execute(explain.format("TEXT") + q(name), params).fetchall()
        conn.rollback()
    plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
    return plan, "\n".join(r["QUERY PLAN"] for r in text)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_sweep_scans_the_history_sequentially(history: tuple[str, int], case: str) -> None:
    url, now_ms = history
    name, params = CASES[case]
    if name.startswith("retention."):
        params = {**params, "before_ms": now_ms, "now_ms": now_ms}
    params = {k: now_ms if v == NOW else v for k, v in params.items()}  # the fill's time
    plan, text = _explain(url, name, params)
    print(f"--- {case} ({HISTORY_ROWS:,} settled runs of history)\n{text}")
    nodes = list(_nodes(plan))
    seq = [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in WATCHED]
    assert not seq, f"{case}: sequential scan of {[n['Relation Name'] for n in seq]}:\n{text}"
    # Bounded: no scan of the run tables touches more than a batch's worth of rows
    # (the pending reads' (status, created) plan peeks one more; see test_sweep_plans).
    bound = PRUNE["limit"] * 4 if name.startswith("retention.") else BATCH + 1
    for node in nodes:
        if node.get("Relation Name") in WATCHED and "Actual Rows" in node:
            read = node["Actual Rows"] * node.get("Actual Loops", 1)
            removed = node.get("Rows Removed by Filter", 0)
            assert read + removed <= bound, f"{case}: {json.dumps(node)[:2000]}\n{text}"
