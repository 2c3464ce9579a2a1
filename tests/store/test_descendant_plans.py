"""A settlement's walk of attached descendants probes indexes, whatever the table holds.

Every terminal settlement (``settle_many``, ``transition_owned``) and every cancel asks
which unsettled runs its lineage reaches through attached edges (SQL blocks
``runs.attached_descendants_many`` and ``runs.attached_descendants``). The recursive step
once joined ``run_parents`` to ``runs`` as plain joins, which the planner, seeing an
empty or tiny ``run_parents``, drove from a sequential scan of every row of ``runs``
(extracting each state's ``on_parent_exit``): 3 ms a settlement beside 1,500 settled
runs, growing with the table, the largest server cost of the user's loop of enqueues
(docs/producer.md, "The settlement's descendant walk"). Each lookup is now a LATERAL
probe; the transaction's own counters (no timing) say what the walk read.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store.queries import q

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
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ANALYZE runfleet.runs")  # statistics of an empty table, as fresh
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
    """With the ids' values visible, a custom plan for a batch of one or two always looked
    cheaper than the generic one, so every settlement planned the walk again (~1 ms, ten
    times its execution). In runfleet.attached_descendants (0024) its plan is the generic
    one from the first call: auto_explain prints the function's parameter, never a call's
    ids. (Timing is the bench's; this is the plan.)"""
    notices: list[str] = []
    async with await psycopg.AsyncConnection.connect(tree, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0")
        await conn.execute("SET auto_explain.log_nested_statements = on")
        await conn.execute("SET auto_explain.log_level = notice")
        await conn.execute("SET auto_explain.log_verbose = on")  # a function scan's arguments
        for i in range(8):
            await conn.execute(q("runs.attached_descendants_many"), {"ids": [f"old-{i + 1}"]})
    walks = [n for n in notices if "WITH RECURSIVE seeds" in n]
    assert len(walks) >= 8, notices
    assert all("unnest($1)" in n for n in walks), walks  # the parameter, never a call's ids
    assert not [n for n in walks if "old-" in n], walks
