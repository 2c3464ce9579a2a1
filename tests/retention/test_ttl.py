"""rq's per-run ``result_ttl`` / ``failure_ttl``: the retention loop's TTL pass deletes a
settled run once its own TTL has passed, with the same safety rules as the fleet pass,
while ``RUNFLEET_RETENTION`` is unset (real worker, real Postgres)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import tests.retention.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.rqface import Job, NoSuchJobError, Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.queries import q
from runfleet.store.retention import MIN_KEY, Pass
from runfleet.store.types import AdmissionOptions, NewRun, RqOptions
from runfleet.worker.process import Worker
from runfleet.worker.retention import RetentionLoop
from tests.retention.test_prune import runs_by_status
from tests.support.polling import until


async def expiry_pass(loop: RetentionLoop) -> Pass:
    """One TTL pass that won the fleet's lock (the worker's own loop may hold it briefly)."""

    async def won() -> Pass | None:
        before = loop.last_expiry
        await loop.tick()
        return loop.last_expiry if loop.last_expiry is not before else None

    return await until(won, 20, "a TTL pass that wins the lock", every=0.05)


async def ttl_passes_until(check: Callable[[], Awaitable[bool]], loop: RetentionLoop) -> None:
    """TTL passes until ``check`` holds, bounded by a deadline."""

    async def passed() -> bool:
        if await check():
            return True
        await expiry_pass(loop)
        return False

    await until(passed, 20, "the TTL pass to delete the run", every=0.1)


async def statuses(store: Store, want: dict[str, str]) -> None:
    """Poll until each run has the wanted status (workers settle them), with a deadline."""
    await until(
        lambda: runs_by_status(store),
        30,
        f"statuses {want}",
        accept=lambda status: all(status.get(k) == v for k, v in want.items()),
        every=0.05,
    )


async def settled_ms(store: Store, run_id: str) -> int:
    row = await store.runs.get(run_id)
    assert row is not None and row.status.terminal
    return row.updated_at_ms


async def db_now_ms(store: Store) -> int:
    row = await store.db.one("retention.cutoff", {"older_than_ms": 0})
    assert row is not None
    return int(row["now_ms"])


async def test_result_ttl_expires_and_minus_one_keeps(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    assert settings.retention_ms is None, "the TTL pass runs with fleet retention unset"
    one = await queue.enqueue(flows.leaf, 1, result_ttl=1)
    zero = await queue.enqueue(flows.leaf, 2, result_ttl=0)
    forever = await queue.enqueue(flows.leaf, 3, result_ttl=-1)
    hour = await queue.enqueue(flows.leaf, 4, result_ttl="1h")
    plain = await queue.enqueue(flows.leaf, 5)
    for run in (one, zero, forever, hour, plain):
        await run.result(timeout=20)
    one_settled = await settled_ms(store, one.id)
    loop = RetentionLoop(store, settings, None, [])

    first = await expiry_pass(loop)
    status = await runs_by_status(store)
    assert zero.id not in status, "result_ttl=0: gone at the first pass after settlement"
    assert first.deleted.runs >= 1 and first.deleted.journal > 0 and first.deleted.steps > 0
    if await db_now_ms(store) < one_settled + 1000:
        assert one.id in status

    async def one_gone() -> bool:
        return one.id not in await runs_by_status(store)

    await ttl_passes_until(one_gone, loop)
    assert await db_now_ms(store) >= one_settled + 1000, "not deleted before its TTL"
    status = await runs_by_status(store)
    assert {forever.id, hour.id, plain.id} <= set(status), "-1, 1h and no TTL are kept"
    assert (await expiry_pass(loop)).deleted.runs == 0

    def rq_reads() -> None:  # an expired job reads as rq's does: gone
        with Queue("default", settings=settings) as q:
            with pytest.raises(NoSuchJobError):
                Job.fetch(one.id, connection=q)
            assert q.fetch_job(one.id) is None
            assert Job.fetch_many([one.id, forever.id], connection=q)[0] is None
            kept = q.fetch_job(forever.id)
            assert kept is not None and kept.is_finished and kept.return_value() == 6

    await asyncio.to_thread(rq_reads)


async def test_failure_ttl_on_a_failed_run(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    brief = await queue.enqueue(flows.fails, failure_ttl=1, result_ttl=-1)
    kept = await queue.enqueue(flows.fails, failure_ttl=-1, result_ttl=0)

    await statuses(store, {brief.id: "failed", kept.id: "failed"})
    settled = await settled_ms(store, brief.id)
    loop = RetentionLoop(store, settings, None, [])

    async def brief_gone() -> bool:
        return brief.id not in await runs_by_status(store)

    await ttl_passes_until(brief_gone, loop)
    assert await db_now_ms(store) >= settled + 1000
    assert (await runs_by_status(store)).get(kept.id) == "failed", (
        "a failed run follows failure_ttl, not result_ttl"
    )


async def test_a_ttl_child_of_an_open_parent_waits_for_the_parent(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    # Children take no rq options, so the TTL'd child is admitted through the store.
    parent = NewRun(
        id="ttl-parent",
        flow="retention.waits",
        options=AdmissionOptions(rq=RqOptions(result_ttl=0)),
    )
    await store.admission.create(parent)
    child = NewRun(
        id="ttl-child",
        flow="retention.leaf",
        payload={"args": [7], "kwargs": {}},
        parent_id=parent.id,
        options=AdmissionOptions(rq=RqOptions(result_ttl=0)),
    )
    await store.admission.create(child)
    # No stream hint: the worker's sweep finds pending runs in Postgres.
    loop = RetentionLoop(store, settings, None, [])
    await statuses(store, {parent.id: "suspended", child.id: "completed"})
    held = await expiry_pass(loop)
    assert held.scanned >= 1 and held.deleted.runs == 0, "the child's TTL passed, but not yet"
    assert set(await runs_by_status(store)) == {parent.id, child.id}

    assert await queue.complete(parent.id, "go", "now")
    await statuses(store, {parent.id: "completed"})

    async def both_gone() -> bool:
        return not await runs_by_status(store)

    await ttl_passes_until(both_gone, loop)


@pytest.mark.parametrize(
    ("scan", "index"), [("expiry", "runs_expiry_idx"), ("settled", "runs_settled_idx")]
)
async def test_each_scan_reads_only_its_own_index(store: Store, scan: str, index: str) -> None:
    """The expiry scan matches the index expression (a rewrite that stops matching would
    silently turn every TTL pass into a full scan), and the branch not asked for is
    planned away, so a fleet without TTLs pays one probe of an empty index."""
    params = {
        "scan": scan,
        "before_ms": 0,
        "now_ms": 0,
        "after_ms": MIN_KEY,
        "after_id": "",
        "limit": 10,
    }
    async with store.db.pool.connection() as conn, conn.transaction(force_rollback=True):
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(b"EXPLAIN " + q("retention.prune_batch").encode(), params)
        lines = [str(next(iter(r.values()))) for r in await cur.fetchall()]
    start = next(i for i, line in enumerate(lines) if line.strip() == "CTE scanned")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("CTE "))
    scanned = "\n".join(lines[start:end])
    assert f"Index Scan on {index} " in scanned or f"Index Scan using {index} " in scanned
    assert "One-Time Filter: false" in scanned, "the other branch is planned away"
    other = "runs_settled_idx" if index == "runs_expiry_idx" else "runs_expiry_idx"
    assert other not in scanned and "Seq Scan" not in scanned, scanned
