"""Retention deletes exactly the runs settled before the cutoff, with every row of theirs,
and keeps any run whose lineage or relatives are still open (real worker, real Postgres)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

import tests.retention.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.retention import PRUNED_TABLES, Retention
from runfleet.worker.process import Worker
from tests.support.polling import until

OPEN = ("pending", "running", "suspended")
ID_COLUMNS = ("run_id", "child_id", "parent_id")


async def _rows(store: Store, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with store.db.pool.connection() as conn:
        cur = await conn.execute(query.encode(), params)
        return [tuple(r.values()) for r in await cur.fetchall()]


async def runs_by_status(store: Store) -> dict[str, str]:
    rows = await _rows(store, "SELECT id, status FROM runfleet.runs")
    return {rid: status for rid, status in rows}


async def table_rows(store: Store) -> dict[str, set[tuple[Any, ...]]]:
    """Every row's run ids in every run-keyed table, as (column, id) pairs per row."""
    found: dict[str, set[tuple[Any, ...]]] = {}
    for table in sorted(PRUNED_TABLES - {"runs"}):
        cols = [
            c
            for (c,) in await _rows(
                store,
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'runfleet' AND table_name = %s",
                table,
            )
            if c in ID_COLUMNS
        ]
        query = sql.SQL("SELECT {} FROM runfleet.{}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in cols), sql.Identifier(table)
        )
        async with store.db.pool.connection() as conn:
            cur = await conn.execute(query)
            found[table] = {tuple(r.values()) for r in await cur.fetchall()}
    return found


async def wait_for(store: Store, predicate: Any, what: str, timeout: float = 20.0) -> None:
    """Poll the runs' statuses until ``predicate`` holds for them (the failure shows them)."""
    await until(lambda: runs_by_status(store), timeout, what, accept=predicate, every=0.05)


async def test_every_run_keyed_table_is_pruned(store: Store) -> None:
    """A table added with a run id column and not taught to retention fails here."""
    assert await Retention(store.db).run_keyed_tables() == PRUNED_TABLES


async def test_prune_deletes_settled_runs_and_keeps_open_lineages(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    retention = Retention(store.db)
    done = [await queue.enqueue(flows.full, i) for i in range(3)]
    for run in done:
        await run.result(timeout=20)
    held_child = await queue.enqueue(flows.parent_waits, 1)
    held_spawn = await queue.enqueue(flows.spawn_then_wait, 2)
    lineage = await queue.enqueue(flows.hands_off)
    alone = await queue.enqueue(flows.waits)
    # 3 full runs with 2 children each, 2 held parents with 1 child each, 2 rounds, 1 alone.
    # The four held runs (the two parents, the lineage's round 1, the lone waiter) must be
    # parked, not merely open: a run still on its way to its park would change status
    # between the snapshot below and the passes it is compared with.
    await wait_for(
        store,
        lambda s: (
            len(s) == 9 + 4 + 2 + 1
            and sum(v not in OPEN for v in s.values()) == 9 + 2 + 1
            and sum(v == "suspended" for v in s.values()) == 4
            and all(s[r.id] == "suspended" for r in (held_child, held_spawn, alone))
        ),
        "everything but the held runs to settle and the held runs to park",
    )
    cutoff = await store.stats.now_ms()
    late = await queue.enqueue(flows.leaf, 7)  # settles after the cutoff: kept
    await late.result(timeout=20)
    before = await runs_by_status(store)
    rows_before = await table_rows(store)

    parents = {r.id for r in done}
    children = {
        c
        for (c,) in await _rows(
            store,
            "SELECT child_id FROM runfleet.run_parents WHERE parent_id = ANY(%s)",
            list(parents),
        )
    }
    assert len(children) == 6
    expected = parents | children

    dry = await retention.prune(cutoff, cutoff, batch=2, dry_run=True)
    assert dry.deleted.runs == len(expected)
    assert dry.deleted.journal > 0 and dry.deleted.steps > 0 and dry.deleted.clocks == 3
    assert dry.deleted.deferreds >= 3 and dry.deleted.edges == 6 and dry.deleted.attempts > 0
    assert await runs_by_status(store) == before, "a dry run deleted something"
    assert await table_rows(store) == rows_before

    real = await retention.prune(cutoff, cutoff, batch=2)
    assert real.complete and real.batches > 2
    assert real.deleted == dry.deleted, "the dry run's counts are what a real pass deletes"
    after = await runs_by_status(store)
    assert set(before) - set(after) == expected
    assert {k: v for k, v in before.items() if k not in expected} == after
    rows_after = await table_rows(store)
    for table, rows in rows_after.items():
        assert not any(set(row) & expected for row in rows), f"{table} keeps pruned run rows"
        kept = {row for row in rows_before[table] if not set(row) & expected}
        assert rows == kept, f"{table}: rows of kept runs changed"

    # Nothing left to prune at the same cutoff: a second pass deletes nothing.
    assert (await retention.prune(cutoff, cutoff)).deleted.runs == 0

    # Once every held run settles, a later cutoff takes them all, the late run too.
    for run in (held_child, held_spawn, alone):
        await queue.complete(run.id, "go", 1)
    ((round1,),) = await _rows(
        store,
        "SELECT id FROM runfleet.runs WHERE lineage_id = %s AND round_ordinal = 1",
        lineage.id,
    )
    await queue.complete(round1, "go", 1)
    await wait_for(store, lambda s: all(v not in OPEN for v in s.values()), "all settled")
    now = await store.stats.now_ms() + 1
    final = await retention.prune(now, now)
    assert final.deleted.runs == len(after)
    assert await runs_by_status(store) == {}
    assert all(not rows for rows in (await table_rows(store)).values())


async def test_exclusive_lock_admits_one_pruner(store: Store) -> None:
    retention = Retention(store.db)
    async with retention.exclusive() as first:
        async with retention.exclusive() as second:
            assert first and not second
    async with retention.exclusive() as again:
        assert again, "the lock is released after a pass"
