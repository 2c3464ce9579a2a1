"""Deduplication keys: while a run holding a queue's dedup_key is open, admitting the key
again answers that run (or refuses, as the caller asks); once it settles the key is free.
Postgres holds the rule (a partial unique index), whoever writes the row."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import DuplicateRun, InvalidInput
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker


async def test_an_open_key_answers_its_run_or_refuses(queue: AsyncQueue, store: Store) -> None:
    first = await queue.enqueue(qf.nap, 10, dedup_key="invoice-7")
    again = await queue.enqueue(qf.nap, 99, dedup_key="invoice-7")  # other args: same run
    assert again.id == first.id
    with pytest.raises(DuplicateRun) as info:
        await queue.enqueue(qf.nap, 10, dedup_key="invoice-7", on_duplicate="refuse")
    assert info.value.open_run_id == first.id and info.value.dedup_key == "invoice-7"
    # A key is per queue; another key is another run.
    async with AsyncQueue("other", settings=queue.settings) as other:
        elsewhere = await other.enqueue(qf.nap, 10, dedup_key="invoice-7")
    assert elsewhere.id != first.id
    assert (await queue.enqueue(qf.nap, 10, dedup_key="invoice-8")).id != first.id
    rows = await store.runs.get_many([first.id])
    assert rows[0].dedup_key == "invoice-7"
    with pytest.raises(InvalidInput):
        await queue.enqueue(qf.nap, 10, on_duplicate="ignore", dedup_key="x")


async def test_a_batch_and_concurrent_admissions_make_one_run(queue: AsyncQueue) -> None:
    batch = await queue.enqueue_many(
        [EnqueueSpec(qf.nap, (i,), options={"dedup_key": "batch-key"}) for i in range(3)]
    )
    assert len({r.id for r in batch}) == 1
    racing = await asyncio.gather(
        *(queue.enqueue(qf.nap, i, dedup_key="race-key") for i in range(20))
    )
    assert len({r.id for r in racing}) == 1


async def test_a_settled_run_frees_its_key(worker: Worker, queue: AsyncQueue) -> None:
    first = await queue.enqueue(qf.nap, 10, dedup_key="nightly")
    assert await first.result(timeout=15) == 10
    second = await queue.enqueue(qf.nap, 20, dedup_key="nightly")
    assert second.id != first.id
    assert await second.result(timeout=15) == 20


async def test_postgres_refuses_a_second_open_run_with_the_key(
    queue: AsyncQueue, settings: Settings
) -> None:
    held = await queue.enqueue(qf.nap, 10, dedup_key="raw-key")
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await c.execute(
                "INSERT INTO runfleet.runs (id, flow, queue, status, lineage_id, created_at_ms,"
                " updated_at_ms, dedup_key) VALUES ('raw-2', 'f', 'default', 'pending', 'raw-2',"
                " 0, 0, 'raw-key')"
            )
    assert (await queue.run(held.id).get_status()) is RunStatus.PENDING
