"""rq's tests/test_worker.py, the cases a producer's code observes, ported: each test runs
on real rq and on runfleet (``rqx``). Only the import, the connection and the worker
differ. ``job.result`` is read as rq reads it, a property (the value, or None)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def test_work_via_string_argument(rqx: Side) -> None:
    q = rqx.Queue("foo")
    job = q.enqueue("tests.rq_parity.rq_fixtures.say_hello", name="Frank")
    rqx.work(q)
    expected_result = "Hi there, Frank!"
    assert job.result == expected_result
    assert job.latest_result().return_value == expected_result
    # rq then asserts job.worker_name is None: its job object, never refreshed, still holds
    # what enqueue wrote; runfleet's reads the run (test_rq_results: the worker's name)


def test_work_via_simpleworker(rqx: Side) -> None:
    """rq's SimpleWorker does not fork; ``rqx.work`` runs either side's worker in this process."""
    fooq, barq = rqx.Queue("foo"), rqx.Queue("bar")
    job = fooq.enqueue(fixtures.say_pid)
    rqx.work(fooq, barq)
    assert job.result == os.getpid(), "PID mismatch, fork() is not supposed to happen here"


def test_work_unicode_friendly(rqx: Side) -> None:
    q = rqx.Queue("foo")
    job = q.enqueue("tests.rq_parity.rq_fixtures.say_hello", name="Adam", description="你好 世界!")
    rqx.work(q)
    assert job.result == "Hi there, Adam!"
    assert job.description == "你好 世界!"


def test_job_times(rqx: Side) -> None:
    q = rqx.Queue("foo")
    before = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    job = q.enqueue(fixtures.say_hello)
    assert job.enqueued_at is not None
    assert job.started_at is None
    assert job.ended_at is None
    rqx.work(q)
    assert job.result == "Hi there, Stranger!"
    after = datetime.now(UTC) + timedelta(seconds=1)
    done = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert before <= _utc(done.enqueued_at) <= after
    assert before <= _utc(done.started_at) <= after
    assert before <= _utc(done.ended_at) <= after
    assert _utc(done.started_at) <= _utc(done.ended_at)


def test_worker_sets_job_status(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    assert job.get_status() == rqx.JobStatus.QUEUED
    assert job.is_queued and not job.is_finished and not job.is_failed
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert not job.is_queued and job.is_finished and not job.is_failed

    job = q.enqueue(fixtures.div_by_zero, args=(1,))
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert not job.is_queued and not job.is_finished and job.is_failed


def test_work_fails(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.count == 0
    job = q.enqueue(fixtures.div_by_zero)
    assert q.count == 1
    enqueued_at = job.enqueued_at
    rqx.work(q)
    assert q.count == 0
    failed = rqx.registry.FailedJobRegistry(queue=q, connection=rqx.connection)
    assert job in failed
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.origin == q.name
    assert _utc(job.enqueued_at).timestamp() == _utc(enqueued_at).timestamp()
    result = job.latest_result()
    assert result.exc_string
    assert result.type == result.Type.FAILED
    assert result.worker_name


def test_self_modification_persistence_with_error(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(
        fixtures.modify_self_and_error,
        meta={"foo": "bar", "baz": 42},
        args=[{"baz": 10, "newinfo": "waka"}],
    )
    rqx.work(q)
    assert q.count == 0
    assert job in rqx.registry.FailedJobRegistry(queue=q, connection=rqx.connection)
    checked = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert checked.meta["foo"] == "bar"
    assert checked.meta["baz"] == 10
    assert checked.meta["newinfo"] == "waka"


def test_cancel_dependent_job(rqx: Side) -> None:
    q = rqx.Queue("low")
    parent = q.enqueue(fixtures.long_running_job, 1, job_id="parent_job")
    job = q.enqueue(fixtures.say_hello, depends_on=parent, job_id="job1")
    job2 = q.enqueue(fixtures.say_hello, depends_on=job, job_id="job2")
    job.cancel()
    rqx.work(q)
    assert job.is_canceled
    assert parent.result is not None
    assert job.get_status() == rqx.JobStatus.CANCELED
    assert job.result is None
    assert job2.result is None
    assert job2.get_status() == rqx.JobStatus.DEFERRED
    assert q.count == 0


def test_cancel_job_enqueue_dependent(rqx: Side) -> None:
    q = rqx.Queue("low")
    parent = q.enqueue(fixtures.long_running_job, 1, job_id="parent_job")
    job = q.enqueue(fixtures.say_hello, depends_on=parent, job_id="job1")
    job2 = q.enqueue(fixtures.say_hello, depends_on=job, job_id="job2")
    job3 = q.enqueue(fixtures.say_hello, depends_on=job2, job_id="job3")
    job.cancel(enqueue_dependents=True)
    rqx.work(q)
    assert job.is_canceled
    assert parent.result is not None
    assert job.get_status() == rqx.JobStatus.CANCELED
    assert job.result is None
    assert job2.result is not None
    assert job2.get_status() == rqx.JobStatus.FINISHED
    assert job3.get_status() == rqx.JobStatus.FINISHED


def test_deleted_jobs_arent_executed(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.create_file, "deleted")
    job.delete()
    rqx.work(q)
    assert q.count == 0
    assert fixtures.saved("created:deleted") is None
