"""A settlement's walk of attached descendants is index probes, planned once, never JIT'd.

Every terminal settlement (``settle_many``, ``transition_owned``) and every cancel asks
which unsettled runs its lineage reaches through attached edges
(``runfleet.attached_descendants``, migration 0024; docs/explanation/admission-path.md).
Each rule here failed once:

- the recursive step joined ``run_parents`` to ``runs`` as plain joins, which the planner
  drove from a sequential scan of every row of ``runs``: 3 ms a settlement beside 1,500
  settled runs, growing with the table (the transaction's own counters say what the walk
  read, no timing);
- with the ids' values visible, every settlement planned the walk again (auto_explain
  shows the parameter, never a call's ids);
- its inflated estimate passed ``jit_above_cost`` and, behind PgBouncer (which refuses the
  connection's ``-c jit=off``), every call compiled it (no JIT section in its plan, with
  JIT forced on for everything else).
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store.queries import q
from tests.store.helpers import explain_every_statement

SETTLED = 3000  # settled runs beside the tree: what a busy queue leaves behind

FILL = """
INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, round_ordinal,
                           created_at_ms, updated_at_ms)
SELECT 'old-' || g, 'f.x', 'q', 'completed', '{}'::jsonb, 'old-' || g, 0, t + g, t + g
  FROM generate_series(1, %(settled)s) g, (SELECT runfleet.now_ms() AS t) now
"""

# p (settled; its second round p@1 suspended)
#   -> a (attached, settled; its second round a@1 pending) -> a2 (attached to a, suspended)
#   -> d (detached, pending), whose own child d2 is attached to d only
TREE: list[tuple[str, str, str, int, str | None, str]] = [
    # id, lineage, status, round, parent, on_parent_exit
    ("p", "p", "completed", 0, None, "cancel"),
    ("p@1", "p", "suspended", 1, None, "cancel"),
    ("a", "a", "completed", 0, "p", "cancel"),
    ("a@1", "a", "pending", 1, None, "cancel"),
    ("a2", "a2", "suspended", 0, "a", "cancel"),
    ("d", "d", "pending", 0, "p", "detach"),
    ("d2", "d2", "pending", 0, "d", "cancel"),
]


@pytest.fixture
async def tree(database_url: str) -> str:
    """The tree beside settled runs, with the statistics of a young database: ``runs`` and
    ``run_parents`` analyzed while empty."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ANALYZE runfleet.runs")
        await conn.execute("ANALYZE runfleet.run_parents")
        await conn.execute(FILL, {"settled": SETTLED})
        for run_id, lineage, status, ordinal, parent, policy in TREE:
            await conn.execute(
                "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
                " round_ordinal, created_at_ms, updated_at_ms)"
                " VALUES (%s, 'f.x', 'q', %s, jsonb_build_object('parent', %s::text,"
                " 'on_parent_exit', %s::text), %s, %s, 1, 1)",
                (run_id, status, parent, policy, lineage, ordinal),
            )
            if parent is not None:
                await conn.execute(
                    "INSERT INTO runfleet.run_parents (child_id, parent_id) VALUES (%s, %s)",
                    (run_id, parent),
                )
    return database_url


async def _walk(
    url: str, name: LiteralString, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The walk's answer and what it read of ``runs``, counted in its own transaction."""
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        async with conn.transaction():
            for _ in range(7):  # past psycopg's prepare threshold and Postgres's custom plans
                answer = await (await conn.execute(q(name), params)).fetchall()
            table = await (
                await conn.execute(
                    "SELECT seq_scan, idx_scan, idx_tup_fetch FROM pg_stat_xact_user_tables"
                    " WHERE schemaname = 'runfleet' AND relname = 'runs'"
                )
            ).fetchone()
    assert table is not None
    return answer, table


async def _explained(url: str, ids: list[list[str]], *settings: str) -> list[str]:
    """auto_explain's plans of the walk, one per call with ``ids``, as notices."""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await explain_every_statement(conn, notices, *settings)
        for batch in ids:
            await conn.execute(q("runs.attached_descendants_many"), {"ids": batch})
    return [n for n in notices if "WITH RECURSIVE seeds" in n]


async def test_the_batch_walk_reads_no_row_of_runs_it_does_not_reach(tree: str) -> None:
    answer, table = await _walk(
        tree, "runs.attached_descendants_many", {"ids": ["p@1", "old-1", "old-2"]}
    )
    # a's every unsettled round and a's attached child; not d (detached), nor d2 (its
    # parent is detached), nor p's own rounds, nor anything of the settled runs.
    assert [(r["root"], r["id"]) for r in answer] == [("p@1", "a2"), ("p@1", "a@1")]
    assert table["seq_scan"] == 0, table
    assert table["idx_tup_fetch"] <= 7 * 40, table  # seven walks of a handful of probes


async def test_the_single_walk_reads_no_row_of_runs_it_does_not_reach(tree: str) -> None:
    answer, table = await _walk(tree, "runs.attached_descendants", {"id": "p"})
    assert [r["id"] for r in answer] == ["a2", "a@1"]
    assert table["seq_scan"] == 0, table
    assert table["idx_tup_fetch"] <= 7 * 40, table


async def test_the_walk_is_not_planned_again_per_settlement(tree: str) -> None:
    """Its plan is the generic one from the first call: auto_explain prints the
    function's parameter, never a call's ids. (Timing is the bench's; this is the plan.)"""
    walks = await _explained(tree, [[f"old-{i + 1}"] for i in range(8)])
    assert len(walks) >= 8, walks
    assert all("unnest($1)" in n for n in walks), walks  # the parameter, never a call's ids
    assert not [n for n in walks if "old-" in n], walks


async def test_the_walk_is_never_jit_compiled(tree: str) -> None:
    """With JIT on for everything a connection runs (as behind PgBouncer, which refuses the
    connection's own ``-c jit=off``, and with every cost past the thresholds), the walk
    still runs interpreted: its plan has no JIT section."""
    async with await psycopg.AsyncConnection.connect(tree) as conn:
        row = await (await conn.execute("SELECT pg_jit_available()")).fetchone()
    if not (row and row[0]):
        pytest.skip("this Postgres has no JIT (no llvmjit): nothing to compile, nothing to prove")
    walks = await _explained(
        tree,
        [["p@1"], ["old-1"]],
        "jit = on",
        "jit_above_cost = 0",
        "jit_inline_above_cost = 0",
        "jit_optimize_above_cost = 0",
        "auto_explain.log_analyze = on",  # JIT is reported for executed plans
    )
    assert len(walks) >= 2, walks
    assert not [n for n in walks if "JIT:" in n], walks
