"""Plans a connection cached while ``runs`` was young do not outlive the table's growth.

A worker's connections prepare their statements in the fleet's first seconds, when
``runs`` and the journal hold a handful of rows; Postgres plans a one-page table as a
sequential scan and keeps that plan until the table's statistics change, which
autovacuum does once a minute at best. In the user's loop, a settlement beside 8,000
runs then read all of them twice (its row lock's ``id = ANY`` and the parents'
hand-over, 1.5-2 ms each, growing with the table; auto_explain in the loop,
docs/explanation/admission-path.md). The sweeper now has Postgres ANALYZE
each runfleet table whose committed rows at least doubled since they were last counted
(``runfleet.analyze_grown``, migration 0025), and the cached plans are made again. And
since migration 0034 the settlement's functions plan with sequential scans off, so even a
plan made young and never refreshed probes the grown table by key. The transaction's own
counters say what the statements read (no timing).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus, Settle, Transitioned
from runfleet.worker.sweeper import Sweeper
from tests.store.helpers import (
    OWNER_A,
    activate,
    committed_rows_counted,
    create,
    explain_every_statement,
    make_running,
)

YOUNG = 6  # settlements while the table is young: their plans are made then
MEASURED = 6
GROWN = 3000  # settled runs added after the plans were made

FILL = """
INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, round_ordinal,
                           created_at_ms, updated_at_ms)
SELECT 'old-' || g, 'f.x', 'q', 'completed', '{}'::jsonb, 'old-' || g, 0, t + g, t + g
  FROM generate_series(1, %(n)s) g, (SELECT runfleet.now_ms() AS t) now
"""


@pytest.fixture(autouse=True)
async def _no_autovacuum(database_url: str) -> None:
    """The tests decide when ``runs`` is analyzed: an autovacuum after FILL would count
    its pages (and refresh its plans) in their place."""
    await _admin(database_url, "ALTER TABLE runfleet.runs SET (autovacuum_enabled = false)")


async def _fill(url: str, rows: int, prefix: str = "old-", *, total: int | None = None) -> None:
    """Insert ``rows`` settled runs, committed and counted by the statistics collector
    (``total``: the live rows then expected in all)."""
    await _admin(url, FILL.replace("'old-'", f"'{prefix}'"), {"n": rows})
    await committed_rows_counted(url, "runfleet.runs", rows if total is None else total)


async def _admin(url: str, sql: Any, params: dict[str, Any] | None = None) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def _counted_pages(url: str, table: str) -> int:
    [(pages,)] = await _admin(
        url, "SELECT relpages FROM pg_class WHERE oid = %(t)s::regclass", {"t": table}
    )
    return int(pages)


async def _counted_rows(url: str, table: str) -> int:
    [(rows,)] = await _admin(
        url, "SELECT reltuples::bigint FROM pg_class WHERE oid = %(t)s::regclass", {"t": table}
    )
    return int(rows)


async def _young_store(database_url: str, settings: Settings) -> Store:
    """One connection whose statements are prepared at first use, on a young database:
    its plans are the ones measured."""
    await _admin(database_url, "ANALYZE runfleet.runs")
    await _admin(database_url, "ANALYZE runfleet.run_parents")
    update = {"prepare_threshold": 0}
    return await Store.open(settings.model_copy(update=update), min_size=1, max_size=1)


KINDS = ["alone", "child"]
"""The two ways a settlement goes (migration 0027): a run with nothing to hand over is
one statement (``runfleet.settle_alone``); a child is settled with its walk and its
parents' hand-over (``runfleet.settle_owned``, ``runfleet.notify_parents``)."""


async def _running(store: Store, run_id: str, kind: str) -> None:
    """A running run that settles ``kind``'s way (a child of ``parent``, made if absent)."""
    if kind == "alone":
        await make_running(store, run_id)
        return
    if await store.runs.get("parent") is None:
        await make_running(store, "parent")
    await create(store, run_id, parent_id="parent")
    await activate(store, run_id)


async def _settle(store: Store, run_id: str) -> None:
    [outcome] = await store.lifecycle.settle_many(
        OWNER_A, [Settle(run_id, 1, RunStatus.COMPLETED, {})]
    )
    assert isinstance(outcome, Transitioned), outcome


async def _read_of_runs(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'runfleet' AND relname = 'runs'"
    )
    row = await cur.fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


async def _grown_settlements(
    database_url: str, store: Store, kind: str, *, refresh: bool
) -> tuple[dict[str, Any], list[str]]:
    """Settle YOUNG runs on a young table, add GROWN runs, (refresh,) settle MEASURED more:
    what those read of ``runs``, and the tables the refresh analyzed."""
    ids = [f"r{i}" for i in range(YOUNG + MEASURED)]
    for run_id in ids:
        await _running(store, run_id, kind)
    await create(store, "sibling")  # a pending run the settlements must leave alone
    for run_id in ids[:YOUNG]:
        await _settle(store, run_id)
    await _fill(database_url, GROWN)
    analyzed = [a.table for a in await store.sweeps.analyze_grown()] if refresh else []
    async with store.transaction() as conn:
        # Read before and after, inside one transaction: the counters also hold what the
        # connection's earlier transactions did and has not yet reported (up to a second's
        # worth, Postgres >= 15), and a transaction reports nothing before it ends.
        before = await _read_of_runs(conn)
        for run_id in ids[YOUNG:]:
            await _settle(store, run_id)
        after = await _read_of_runs(conn)
    table = {k: after[k] - before[k] for k in ("seq_scan", "idx_tup_fetch")}
    rows = {row.id: row for row in await store.runs.get_many([*ids, "sibling"])}
    assert all(rows[i].status is RunStatus.COMPLETED for i in ids), rows
    assert rows["sibling"].status is RunStatus.PENDING
    return table, analyzed


@pytest.mark.parametrize("kind", KINDS)
async def test_a_plan_made_young_reads_the_grown_table_by_probes(
    database_url: str, settings: Settings, kind: str
) -> None:
    """Without a refresh the young plans stay, and they read ``runs`` by key all the same:
    the settlement's functions plan with sequential scans off (migration 0034), so a
    connection's first calls on a young table do not fix a scan that grows with it."""
    store = await _young_store(database_url, settings)
    try:
        table, analyzed = await _grown_settlements(database_url, store, kind, refresh=False)
    finally:
        await store.close()
    assert analyzed == []
    assert table["seq_scan"] == 0, table
    assert table["idx_tup_fetch"] <= MEASURED * 20, table


@pytest.mark.parametrize("kind", KINDS)
async def test_after_the_refresh_a_settlement_reads_only_its_runs(
    database_url: str, settings: Settings, kind: str
) -> None:
    store = await _young_store(database_url, settings)
    try:
        table, analyzed = await _grown_settlements(database_url, store, kind, refresh=True)
    finally:
        await store.close()
    assert analyzed == ["runs"], analyzed
    assert table["seq_scan"] == 0, table
    assert table["idx_tup_fetch"] <= MEASURED * 20, table  # a handful of probes each


@pytest.mark.parametrize("kind", KINDS)
async def test_the_hand_over_never_joins_runs_to_itself(
    database_url: str, settings: Settings, kind: str
) -> None:
    """``runs`` analyzed while a bulk admission was in flight: its pages, no live row, so
    the planner believes it empty. As plain joins, the generic plan of the parents'
    hand-over then joined runs to itself three times by whole-index scans, and a
    settlement beside 1,000 runs ran past a minute (a SIGKILLed worker's runs waited for
    it: tests/fleet/test_recovery_first.py). Each lookup is a probe from the batch
    outwards now: a settlement reads at most its batch times the table, whatever the
    statistics."""
    async with await psycopg.AsyncConnection.connect(database_url) as bulk:
        await bulk.execute(FILL, {"n": 1000})  # not committed yet
        await _admin(database_url, "ANALYZE runfleet.runs")
        await bulk.commit()
    assert await _counted_rows(database_url, "runfleet.runs") == 0  # the hazard, as found
    assert await _counted_pages(database_url, "runfleet.runs") > 0
    update = {"prepare_threshold": 0}
    store = await Store.open(
        settings.model_copy(update=update), min_size=1, max_size=1, statement_timeout_ms=5000
    )
    try:
        ids = [f"r{i}" for i in range(YOUNG + MEASURED)]
        for run_id in ids:
            await _running(store, run_id, kind)
        for run_id in ids[:YOUNG]:
            await _settle(store, run_id)  # the generic plans are made
        async with store.transaction() as conn:
            before = await _read_of_runs(conn)
            for run_id in ids[YOUNG:]:
                await _settle(store, run_id)
            after = await _read_of_runs(conn)
    finally:
        await store.close()
    read = (after["seq_tup_read"] - before["seq_tup_read"]) + (
        after["idx_tup_fetch"] - before["idx_tup_fetch"]
    )
    assert read <= MEASURED * 4 * (1000 + len(ids)), read


async def test_rows_still_in_flight_do_not_count(database_url: str, store: Store) -> None:
    """The refresh counts committed rows, not pages: a bulk admission in flight grows the
    pages first, and an ANALYZE then would record the empty table above."""
    async with await psycopg.AsyncConnection.connect(database_url) as bulk:
        await bulk.execute(FILL, {"n": GROWN})  # not committed yet
        assert await store.sweeps.analyze_grown() == []
        await bulk.commit()
    await committed_rows_counted(database_url, "runfleet.runs", GROWN)
    assert [a.table for a in await store.sweeps.analyze_grown()] == ["runs"]
    assert await _counted_rows(database_url, "runfleet.runs") == GROWN


async def test_a_table_is_analyzed_once_per_doubling(database_url: str, store: Store) -> None:
    assert await store.sweeps.analyze_grown() == []  # a new database: nothing grew
    await _fill(database_url, GROWN)
    [runs] = await store.sweeps.analyze_grown()
    assert (runs.table, runs.rows_counted, runs.rows_now) == ("runs", 0, GROWN), runs
    assert await _counted_rows(database_url, "runfleet.runs") == GROWN
    assert await store.sweeps.analyze_grown() == []  # counted now: not again
    await _fill(database_url, GROWN // 2, "more-", total=GROWN + GROWN // 2)
    assert await store.sweeps.analyze_grown() == []  # grown by half: autovacuum's business
    await _fill(database_url, GROWN, "most-", total=2 * GROWN + GROWN // 2)
    assert [a.table for a in await store.sweeps.analyze_grown()] == ["runs"]


async def test_one_process_refreshes_at_a_time(database_url: str, store: Store) -> None:
    """Another caller holds the refresh's lock: this one skips at once, analyzing nothing
    (it does not queue behind an ANALYZE), and the next call does the work."""
    await _fill(database_url, GROWN)
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.execute(  # the refresh's lease (migration 0031), as another caller holds it
            "SELECT FROM runfleet.sweep_leases WHERE name = 'statistics' FOR UPDATE"
        )
        assert await store.sweeps.analyze_grown() == []
        assert await _counted_pages(database_url, "runfleet.runs") == 0
    assert "runs" in [a.table for a in await store.sweeps.analyze_grown()]


async def test_a_table_a_vacuum_holds_is_skipped_not_waited_for(
    database_url: str, store: Store
) -> None:
    """A VACUUM (autovacuum's) holds the table's SHARE UPDATE EXCLUSIVE lock, which ANALYZE
    needs too: the refresh skips that table after its lock timeout (the VACUUM counts the
    pages itself) rather than stalling the sweeper's tick behind it."""
    await _fill(database_url, GROWN)
    async with await psycopg.AsyncConnection.connect(database_url) as vacuum:
        await vacuum.execute("LOCK TABLE runfleet.runs IN SHARE UPDATE EXCLUSIVE MODE")
        began = time.monotonic()
        analyzed = [a.table for a in await store.sweeps.analyze_grown()]
        assert time.monotonic() - began < 5.0
        assert "runs" not in analyzed, analyzed
        assert await _counted_pages(database_url, "runfleet.runs") == 0
    assert "runs" in [a.table for a in await store.sweeps.analyze_grown()]


async def _nothing(_run_ids: list[str], _reason: str) -> set[str]:
    return set()


@pytest.mark.parametrize("refresh", [True, False])
async def test_the_sweeper_refreshes_every_tick_unless_told_not_to(
    database_url: str, settings: Settings, store: Store, refresh: bool
) -> None:
    await _fill(database_url, GROWN)
    told = settings.model_copy(update={"refresh_statistics": refresh})
    await Sweeper(store, told, _nothing).tick()
    counted = await _counted_pages(database_url, "runfleet.runs")
    assert (counted >= 16) is refresh, counted


@pytest.mark.parametrize(
    ("kind", "heads"),
    [("child", ("WITH wanted AS", "WITH settled AS")), ("alone", ("WITH wanted AS", "bool_or"))],
)
async def test_a_settlement_is_planned_once_per_connection(
    store: Store, kind: str, heads: tuple[str, str]
) -> None:
    """The batch settlement and the parents' hand-over run from generic plans
    (``runfleet.settle_owned``, ``runfleet.notify_parents``): auto_explain prints their
    parameters, never a call's ids. As statements, a custom plan won every call and each
    settlement planned both again (0.8 and 1.0 ms, several times their execution). A run
    alone is settled by ``runfleet.settle_alone``, whose question is planned once too."""
    ids = [f"once-{i}" for i in range(8)]
    for run_id in ids:
        await _running(store, run_id, kind)
    notices: list[str] = []
    async with store.transaction() as conn:
        await explain_every_statement(conn, notices, local=True)
        for run_id in ids:
            await _settle(store, run_id)
    for head in heads:
        plans = [n for n in notices if head in n]
        assert len(plans) == len(ids), (head, notices)
        assert all("$1" in n for n in plans), plans  # the parameter ...
        assert not [n for n in plans if "once-" in n], plans  # ... never a call's ids
