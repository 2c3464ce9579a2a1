"""A single-run claim reads its one row by primary key however deep the backlog behind it.

The statistics a backlog meets are stale by nature: a burst of admissions into a table
the planner last analyzed when it held a few settled runs (autovacuum's analyze runs
only after 10 % of the table changed). With them, a claim whose WHERE clause states a
pending partial index's predicate ("pending, not waiting, not claimed") took that index
for empty and walked all of it for the one id it wanted: `claim_if_fresh`'s priority
look-ahead read 100,000 entries (~210 ms a claim at a 100,000-run backlog, a semi join
driven by a scan of runs_ready_priority_idx) and `claim_and_activate` scanned
runs_runnable_pending_idx for its id (docs/explanation/backlogs.md). Every scan of `runs` in these
statements must be a bounded index scan: a handful of buffers, never one proportional to
the pending rows.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store.queries import q
from tests.store.helpers import ANALYZED_AS_JSON, explain_every_statement

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


@pytest.fixture(params=["analyzed on 100 settled", "never analyzed"])
async def stale_backlog(database_url: str, request: pytest.FixtureRequest) -> str:
    """A few settled runs analyzed (or nothing analyzed), then a burst of pending ones the
    planner never saw."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # Autovacuum off on this database's table: the statistics stay what the burst found.
        await conn.execute("ALTER TABLE runfleet.runs SET (autovacuum_enabled = false)")
        if request.param == "analyzed on 100 settled":
            await conn.execute(
                "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id,"
                " created_at_ms, updated_at_ms) SELECT 'done-' || g, 'f.x', 'q', 'completed',"
                " 'done-' || g, 1, 1 FROM generate_series(1, 100) g"
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


async def _plan_of(conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any]) -> Any:
    """The executed plan of ``name``, or of the statement inside the function it calls
    (``runs.claim_if_fresh`` calls runfleet.claim_fresh: auto_explain reads the plan that
    function keeps, the generic one), with ANALYZE and BUFFERS."""
    if "runfleet.claim_fresh(" not in q(name):
        cur = await conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {q(name)}", params)
        row = await cur.fetchone()
        assert row is not None
        return row["QUERY PLAN"][0]["Plan"]
    notices: list[str] = []
    await explain_every_statement(
        conn,
        notices,
        *ANALYZED_AS_JSON,
        local=True,
    )
    await conn.execute(q(name), params)
    inner = [n for n in notices if "WITH seen AS" in n]
    assert len(inner) == 1, notices
    plan = json.loads(inner[0][inner[0].index("{") :])
    return plan["Plan"]


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_claim_probes_its_row_whatever_the_backlog(stale_backlog: str, case: str) -> None:
    name, extra = CASES[case]
    async with await psycopg.AsyncConnection.connect(stale_backlog, row_factory=dict_row) as conn:
        # A first call in a session also plans queue_free_slots' own statements (catalog
        # reads counted against the node that calls it); a worker's connection is warm.
        async with conn.transaction(force_rollback=True):
            await _plan_of(conn, name, {**BASE, **extra, "id": "p-000001"})
        # A run in the middle of the backlog: older ones are ahead of it in every pending
        # index, newer ones behind it.
        async with conn.transaction(force_rollback=True):
            plan = await _plan_of(conn, name, {**BASE, **extra, "id": f"p-{PENDING // 2:06d}"})
    scans = _scans(plan)
    assert scans, f"{case}: no scan of runs in {plan}"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (case, scan["Node Type"])
        touched = scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0)
        assert touched <= MAX_BUFFERS, (case, scan["Index Name"], touched)
        assert scan["Actual Rows"] * scan["Actual Loops"] <= 1, (case, scan["Index Name"])


async def test_a_fresh_claim_is_planned_once_per_connection(stale_backlog: str) -> None:
    """runs.claim_if_fresh as a prepared statement was planned again for every call (its
    generic plan looked dearer than each custom one): 0.7 ms of an idle start. Inside
    runfleet.claim_fresh the plan is the generic one from the first call: auto_explain
    prints the function's parameter, not the call's id, in the primary-key probe."""
    async with await psycopg.AsyncConnection.connect(stale_backlog, row_factory=dict_row) as conn:
        for i in range(1, 9):
            async with conn.transaction(force_rollback=True):
                notices: list[str] = []
                await explain_every_statement(conn, notices, local=True)
                run_id = f"p-{i:06d}"
                await conn.execute(
                    q("runs.claim_if_fresh"), {**BASE, "flow": "f.x", "ahead_flows": ["f.x"],
                                               "id": run_id}
                )  # fmt: skip
                inner = [n for n in notices if "WITH seen AS" in n]
                assert len(inner) == 1, notices
                assert "runs_pkey" in inner[0], inner[0]
                assert run_id not in inner[0], inner[0]  # no call's value: the generic plan


BATCH = 64
"""A stream read's batch per process (the worker's concurrency in the backlog bench)."""


@pytest.fixture(params=["never analyzed", "analyzed with the backlog"])
async def unanalyzed_backlog(database_url: str, request: pytest.FixtureRequest) -> str:
    """A burst of pending runs into a table nothing has analyzed yet (a fresh install, or
    the drain benchmark's 30,000-run phase after its 1,000-run one: too few changes for
    autovacuum's analyze); or the same burst analyzed (the planner knows the backlog)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE runfleet.runs SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
            " updated_at_ms) SELECT 'p-' || lpad(g::text, 6, '0'), 'f.x', 'q', 'pending',"
            " 'p-' || g, t + g, t + g FROM generate_series(1, %(n)s) g,"
            " (SELECT runfleet.now_ms() AS t) now",
            {"n": PENDING},
        )
        if request.param == "analyzed with the backlog":
            await conn.execute("ANALYZE runfleet.runs")
    return database_url


@pytest.mark.parametrize("plans_mode", ["force_custom_plan", "force_generic_plan"])
async def test_the_batch_claim_probes_its_rows_whatever_the_backlog(
    unanalyzed_backlog: str, plans_mode: str
) -> None:
    """``claim_and_activate_many`` for 64 delivered runs in the middle of the backlog.

    On a table never analyzed, the batch's custom-planned UPDATE was
    planned as a nested loop over a sequential scan of all of ``runs`` (estimated one
    row), joined to the chosen ids row by row: 30,000 rows × 64 ids (1.9 million join
    filter evaluations), ~2 s a claim at a 30,000-run backlog in the drain benchmark
    (docs/explanation/backlogs.md). Every scan of ``runs`` must be an index scan of the batch's
    rows, in the plan a worker's connection runs: psycopg prepares a statement after its fifth
    execution and Postgres plans it for the values given (custom) or keeps a generic plan:
    both are forced in turn, and the plan is read from the server's own ``auto_explain``
    output of the statement as the driver sent it.
    """
    first = PENDING // 2
    ids = [f"p-{first + i:06d}" for i in range(BATCH)]
    params = {
        **BASE,
        "ids": ids,
        "epochs": [0] * BATCH,
        "seqs": list(range(1, BATCH + 1)),
        "ahead_flows": ["f.x"],
        "serves": ["q"],
    }
    plans: list[str] = []
    async with await psycopg.AsyncConnection.connect(
        unanalyzed_backlog, row_factory=dict_row
    ) as conn:
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_analyze = on",
            "SET auto_explain.log_buffers = on",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_format = json",
            f"SET plan_cache_mode = {plans_mode}",
        ):
            await conn.execute(setting)
        await conn.commit()
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET LOCAL client_min_messages = log")
            cur = await conn.execute(q("runs.claim_and_activate_many"), params, prepare=True)
            claimed = await cur.fetchall()
    assert len(claimed) == BATCH  # the statement did its work
    found = [json.loads(p.split("plan:", 1)[1]) for p in plans if "claim_and_activate" in p]
    assert len(found) == 1, plans
    scans = _runs_scans(found[0]["Plan"])
    assert scans, f"no scan of runs in {found[0]}"
    for scan in scans:
        assert scan["Node Type"] != "Seq Scan", scan
        if scan["Node Type"] == "Bitmap Heap Scan":
            assert [p.get("Index Name") for p in scan["Plans"]] == ["runs_pkey"], scan
        touched = scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0)
        assert touched <= BATCH * 8, (scan["Node Type"], scan.get("Index Name"), touched)
        assert scan["Actual Rows"] * scan["Actual Loops"] <= BATCH, scan


def _runs_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    scan = plan.get("Relation Name") == "runs" and plan["Node Type"] != "ModifyTable"
    found = [plan] if scan else []
    for child in plan.get("Plans", []):
        found += _runs_scans(child)
    return found
