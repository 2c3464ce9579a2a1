"""A flow's bookkeeping failing while the lease holds: retried, then the run is released
(``infra-unavailable``), never settled ``failed``; it completes once the store answers.

In-process worker: the lease renews on its own pool, so only the flow's store calls
fail here — the case where the lease does not end the retrying by itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg.errors as pg
import pytest

import runfleet.worker.retry as worker_retry
import tests.chaos.flows as cf
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.steps import StepWrite
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.support.polling import until


async def test_bookkeeping_that_gives_up_releases_the_run_instead_of_failing_it(
    worker: Worker, queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_retry, "DURABLE_GIVE_UP_S", 0.5)
    steps = worker.store.steps
    real_record = steps.record_many
    calls: list[str] = []

    async def failing_record(_me: object, writes: Sequence[StepWrite]) -> object:
        calls.extend(write.key for write in writes)
        raise pg.AdminShutdown("terminating connection due to administrator command")

    monkeypatch.setattr(steps, "record_many", failing_record)
    run = await queue.enqueue(cf.two_steps, "t")

    async def released() -> bool:
        records = await store.journal.records(run.id)
        return any(
            r.kind == "interrupt-released"
            and isinstance(r.payload, dict)
            and r.payload.get("detail") == "infra-unavailable"
            for r in records
        )

    await until(released, 15, "the run to be released for its failing bookkeeping")
    assert len(calls) > 2, "the record was not retried before giving up"
    assert (await run.get_status()) is not RunStatus.FAILED
    monkeypatch.setattr(steps, "record_many", real_record)
    assert await run.result(timeout=20) == ["t-a", "t-b"]
    assert await store.stats.settled_more_than_once() == {}
