"""rq's status words for a run: an open run whose cancel was asked reads ``canceled`` at
once, whatever instant of its closing a reader catches (rq's ``cancel`` answers at once)."""

from __future__ import annotations

from runfleet.rqface.jobs import JobStatus, job_status
from runfleet.store import Store
from runfleet.store.types import RunStatus, Waiting, WaitingReason
from tests.store.helpers import OWNER_A, activate, create, make_parked


async def test_an_open_run_with_a_cancel_asked_reads_canceled(store: Store) -> None:
    pending = await create(store, "pending")
    running = await create(store, "running")
    await activate(store, running.id)
    await make_parked(store, "parked", Waiting(WaitingReason.EVENT), OWNER_A)
    ids = ["pending", "running", "parked"]
    before = {row.id: job_status(row) for row in await store.runs.get_many(ids)}
    assert before == {
        "pending": JobStatus.QUEUED,
        "running": JobStatus.STARTED,
        "parked": JobStatus.STARTED,
    }
    assert job_status(pending, deferred=True) is JobStatus.DEFERRED
    for run_id in ids:
        await store.lifecycle.request_cancel(run_id)
    rows = await store.runs.get_many(ids)
    assert {row.status for row in rows} == {
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.SUSPENDED,
    }, "the cancel is only asked: each run is still open"
    for row in rows:
        assert job_status(row) is JobStatus.CANCELED, row.id
        assert job_status(row, deferred=True) is JobStatus.CANCELED, row.id
