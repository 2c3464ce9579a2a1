"""A step's two writes (its attempt's start, its record) take their batch as one jsonb
parameter, carry every text and number through it intact, and probe only their own runs.

With parallel arrays (13 for a record, 3 for a start) psycopg probed each element of each
array for its type and quoted it with a regular expression on every call: in a worker's
CPU profile of the three-step flows loop the record's calls were a fifth of the process,
most of it that dumping (docs/explanation/admission-path.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runfleet.store import Store
from runfleet.store.queries import q
from runfleet.store.steps import StepWrite
from tests.store.helpers import ANALYZED_AS_JSON, OWNER_A, explain_every_statement, make_running

AWKWARD = 'a "quoted" \\ back\\slash, {braces}, NULL, é, ☃, \\u0000-lookalike, \t tab\nline'


@pytest.mark.parametrize("name", ["steps.record", "steps.attempt_start"])
def test_a_step_write_takes_one_jsonb_batch(name: str) -> None:
    text = q(name)
    assert "%(batch)s::jsonb" in text, f"{name}: the batch is not one jsonb parameter"
    arrays = re.findall(r"%\((\w+)\)[sb]::\w+(?: \w+)?\[\]", text)
    assert arrays == [], f"{name}: still takes parallel arrays {arrays}"


async def test_texts_and_numbers_survive_the_step_batch(store: Store) -> None:
    """Every field of a record batch, through the jsonb parameter and back, for several
    runs at once: awkward keys, names, outputs and compensation names, large integers."""
    runs = [await make_running(store, f"sb-{i}") for i in range(3)]
    big = 2**53 + 7  # past a float's integers: a JSON number Postgres must keep exact
    for attempt in (1, 2):  # the record ends attempt 2: distinct from the epoch (1)
        starts = await store.steps.start_attempts(
            OWNER_A, [(run.id, run.epoch, f"step:{AWKWARD}#1") for run in runs]
        )
        assert starts == [attempt] * 3
    outputs: list[Any] = [AWKWARD, {AWKWARD: [AWKWARD, big, -big, 1.5, None, True]}, big]
    writes = [
        StepWrite(
            run.id,
            run.epoch,
            f"step:{AWKWARD}#1",
            AWKWARD,
            "step",
            position,
            output,
            compensate=f"undo.{AWKWARD}",
            attempt=2,
        )
        for position, (run, output) in enumerate(zip(runs, outputs, strict=True))
    ]
    recorded = await store.steps.record_many(OWNER_A, writes)
    for write, record in zip(writes, recorded, strict=True):
        assert record is not None, write.run_id
        (stored,) = await store.steps.of_run(write.run_id)
        for seen in (record, stored):
            assert (seen.key, seen.name, seen.position) == (write.key, write.name, write.position)
            assert seen.output == write.output and type(seen.output) is type(write.output)
            assert seen.compensate == write.compensate
            assert seen.intact, "the digest was taken over the text the row holds"
        (journaled,) = [
            r for r in await store.journal.records(write.run_id) if r.kind == "step-recorded"
        ]
        assert journaled.payload == {
            "key": write.key, "kind": "step", "position": write.position, "epoch": write.epoch,
        }  # fmt: skip
        attempts = await store.steps.attempts(write.run_id, write.key)
        assert [a["finished_at_ms"] is not None for a in attempts] == [False, True]


RUNNING = 30_000
OWNED = 500
"""Runs ``OWNER_A`` holds besides the batch's: a worker's runs in flight."""
IDS = [f"r-{n:06d}" for n in (5, RUNNING // 2, RUNNING - 5)]
MAX_BUFFERS = 24
"""Three primary-key probes touch a handful of buffers each; the owner's 500 runs, ~500."""


@pytest.fixture(params=["never analyzed", "analyzed"])
async def running_table(database_url: str, request: pytest.FixtureRequest) -> str:
    """30,000 running runs of 1,000 processes, and ``OWNER_A`` holding the batch's three
    and 500 more (a jsonb batch is planned as 100 rows: reading the owner's runs by
    runs_owner_idx and hashing them looked cheaper than 100 primary-key probes)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE runfleet.runs SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
            " updated_at_ms, owner_host, owner_pid, owner_nonce, epoch, heartbeat_at_ms)"
            " SELECT 'r-' || lpad(g::text, 6, '0'), 'f.x', 'q', 'running', 'r-' || g,"
            " t + g, t + g, 'host-' || g %% 1000, 1, 'nonce', 1, t"
            " FROM generate_series(1, %(n)s) g, (SELECT runfleet.now_ms() AS t) now",
            {"n": RUNNING},
        )
        await conn.execute(
            "UPDATE runfleet.runs SET owner_host = %(host)s, owner_pid = %(pid)s,"
            " owner_nonce = %(nonce)s WHERE id = ANY(%(ids)s)",
            {
                "ids": IDS + [f"r-{n:06d}" for n in range(1000, 1000 + OWNED)],
                "host": OWNER_A.host_id,
                "pid": OWNER_A.pid,
                "nonce": OWNER_A.nonce,
            },
        )
        if request.param == "analyzed":
            await conn.execute("ANALYZE runfleet.runs")
    return database_url


def _runs_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Relation Name") == "runs" else []
    for child in plan.get("Plans", []):
        found += _runs_scans(child)
    return found


def _batch(ids: list[str]) -> dict[str, Any]:
    owner = {"host": OWNER_A.host_id, "pid": OWNER_A.pid, "nonce": OWNER_A.nonce}
    record = [
        {"run_id": run_id, "key": "step:a#1", "name": "a", "kind": "step", "position": 0,
         "output": "1", "digest": "d", "epoch": 1, "compensate": None, "attempt": 1,
         "seq": i, "payload": {"key": "step:a#1"}, "payload_digest": "p"}
        for i, run_id in enumerate(ids)
    ]  # fmt: skip
    return {
        "batch": Jsonb(record),
        "source_id": "plans",
        "journal_kind": "step-recorded",
        **owner,
    }


async def _explained(conn: psycopg.AsyncConnection[Any], name: str, generic: bool) -> Any:
    """The plan ``name`` runs on the batch of ``IDS`` as a worker's connection sends it
    (a prepared statement), planned for its values (custom) or without them (generic:
    the plan a connection may keep after five calls), read from auto_explain."""
    notices: list[str] = []
    mode = "force_generic_plan" if generic else "force_custom_plan"
    await explain_every_statement(
        conn,
        notices,
        *ANALYZED_AS_JSON,
        f"plan_cache_mode = {mode}",
        local=True,
    )
    await conn.execute(q(name), _batch(IDS), prepare=True)
    (logged,) = [n for n in notices if "plan:" in n]
    return json.loads(logged.split("plan:", 1)[1])


@pytest.mark.parametrize("generic", [False, True], ids=["custom plan", "generic plan"])
@pytest.mark.parametrize("name", ["steps.record", "steps.attempt_start"])
async def test_a_step_batch_probes_only_its_runs(
    running_table: str, name: str, generic: bool
) -> None:
    """The batch's rows read ``runs`` by primary key, however many runs the table and
    the owner hold (one probe per row; fails if the fence's conditions reach the scan)."""
    async with await psycopg.AsyncConnection.connect(running_table, row_factory=dict_row) as conn:
        async with conn.transaction(force_rollback=True):
            row = await _explained(conn, name, generic)
    plan: dict[str, Any] = row["Plan"]
    scans = _runs_scans(plan)
    assert scans, f"{name}: no scan of runs in {plan}"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (name, scan["Node Type"])
        assert scan["Index Name"] == "runs_pkey", (name, scan["Index Name"])
        touched = scan.get("Shared Hit Blocks", 0) + scan.get("Shared Read Blocks", 0)
        assert touched <= MAX_BUFFERS, (name, scan["Index Name"], touched)
        assert scan["Actual Rows"] * scan["Actual Loops"] <= len(IDS), (name, scan["Index Name"])
