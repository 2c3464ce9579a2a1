"""rq's Job and Queue reads on runfleet runs: predicates, fields, meta, queue contents."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from runfleet.rqface import Job, JobStatus, Queue
from runfleet.store.config import Settings
from tests.rq_parity import jobs
from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side, ThreadWorker
from tests.support.polling import until_sync


@pytest.fixture
def q(settings: Settings) -> Iterator[Queue]:
    with Queue("default", settings=settings) as queue:
        yield queue


def test_a_queued_job_reads_as_rq_reads_it(q: Queue, thread_worker: ThreadWorker) -> None:
    job = q.enqueue(jobs.echo, 1, "two", flag=True, job_id="handle-1", meta={"owner": "ann"})
    assert job.id == "handle-1"
    assert job.get_status() is JobStatus.QUEUED and job.get_status() == "queued"
    assert job.is_queued and not job.is_started and not job.is_finished and not job.is_failed
    assert not job.is_canceled and not job.is_scheduled and not job.is_deferred
    assert q.count == 1 and q.job_ids == ["handle-1"] and not q.is_empty()
    assert [j.id for j in q.jobs] == ["handle-1"]
    fetched = q.fetch_job("handle-1")
    assert fetched is not None
    assert fetched.func_name == "tests.rq_parity.jobs.echo"
    assert fetched.args == (1, "two") and fetched.kwargs == {"flag": True}
    assert fetched.origin == "default" and fetched.meta == {"owner": "ann"}
    assert fetched.description == "tests.rq_parity.jobs.echo(1, 'two', flag=True)"
    assert fetched.enqueued_at is not None and fetched.started_at is None
    assert fetched.ended_at is None and fetched.return_value() is None
    assert fetched.latest_result() is None and fetched.exc_info is None
    assert q.fetch_job("no-such-job") is None
    assert [j and j.id for j in Job.fetch_many(["handle-1", "nope"], connection=q)] == [
        "handle-1",
        None,
    ]
    fetched.meta["progress"] = 50
    fetched.save_meta()
    assert Job.fetch("handle-1", connection=q).meta == {"owner": "ann", "progress": 50}

    thread_worker.start()
    assert job.wait(20) == {"args": [1, "two"], "kwargs": {"flag": True}}
    assert job.is_finished and job.get_status(refresh=False) is JobStatus.FINISHED
    assert job.return_value() == {"args": [1, "two"], "kwargs": {"flag": True}}
    latest = job.latest_result()
    assert latest is not None and latest.type.name == "SUCCESSFUL"
    assert latest.return_value == job.return_value()
    assert job.enqueued_at and job.started_at and job.ended_at
    assert job.enqueued_at <= job.started_at <= job.ended_at
    assert job.meta == {"owner": "ann", "progress": 50}  # the worker's settlement kept it
    assert q.count == 0 and q.is_empty() and q.job_ids == []


def test_failure_exc_info_and_the_failed_registry(
    q: Queue, thread_worker: ThreadWorker, tmp_path: Path
) -> None:
    thread_worker.start()
    marker = tmp_path / "fixed"
    job = q.enqueue(jobs.fail_unless_exists, str(marker), job_id="handle-fails")
    until_sync(lambda: job.is_failed, 20, "the job to fail")
    assert job.return_value() is None
    assert job.exc_info is not None and "FileNotFoundError" in job.exc_info
    latest = job.latest_result()
    assert latest is not None and latest.type.name == "FAILED"
    registry = q.failed_job_registry
    assert registry.get_job_ids() == ["handle-fails"] and registry.count == 1
    assert "handle-fails" in registry
    marker.write_text("")
    again = registry.requeue("handle-fails")
    assert again.id == "handle-fails"  # rq keeps the id across a requeue; so does this
    assert job.wait(20) == "ok"  # waits on the new round, not the failed one
    until_sync(lambda: job.is_finished, 20, "the job to finish")
    assert job.return_value() == "ok" and registry.count == 0
    # Requeueing a run that no longer failed is refused, as rq refuses a job not in the registry.
    with pytest.raises(Exception, match="not failed"):
        registry.requeue("handle-fails")


def test_scheduled_cancelled_and_empty(q: Queue) -> None:
    later = q.enqueue_in(timedelta(hours=1), jobs.add, 1, 2, job_id="handle-later")
    assert later.is_scheduled and later.get_status() == "scheduled"
    assert q.job_ids == []  # a scheduled job is not in the queue yet, as in rq
    first = q.enqueue(jobs.add, 1, 1)
    second = q.enqueue(jobs.add, 2, 2)
    assert q.job_ids == [first.id, second.id]
    first.cancel()
    assert first.is_canceled and q.job_ids == [second.id]
    assert q.empty() == 1  # rq's empty deletes the jobs: gone for rq's reads
    assert not Job.exists(second.id, connection=q) and q.is_empty() and q.count == 0
    later.delete()
    assert not Job.exists(later.id, connection=q) and q.fetch_job(later.id) is None


def test_rq_options_are_options_not_arguments(q: Queue) -> None:
    job = q.enqueue(
        jobs.echo,
        1,
        job_timeout="10m",
        result_ttl=60,
        failure_ttl="1d",
        description="custom",
        at_front=True,
        x=2,
    )
    assert job.args == (1,) and job.kwargs == {"x": 2} and job.description == "custom"
    call = q.enqueue_call(jobs.echo, args=(3,), kwargs={"y": 4}, job_id="handle-call")
    assert call.id == "handle-call" and call.args == (3,) and call.kwargs == {"y": 4}
    with pytest.raises(Exception, match="repeat"):
        q.enqueue(jobs.echo, repeat=5)
    assert q.enqueue(jobs.echo, ttl=5).ttl == 5


def test_the_default_job_timeout_is_enforced_without_rq_options(
    rf: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain function enqueued with no option at all runs on the worker's plain path;
    rq's default job timeout (``DEFAULT_JOB_TIMEOUT``, shortened here) still applies there,
    and the jobs that end in time are unaffected."""
    from runfleet.worker import driver

    monkeypatch.setattr(driver, "DEFAULT_JOB_TIMEOUT", 1)
    q = rf.Queue()
    slow = q.enqueue(fixtures.long_running_job, 4)
    quick = q.enqueue(fixtures.say_hello)
    rf.work(q)
    assert slow.get_status() == rf.JobStatus.FAILED
    assert "JobTimeoutException" in (slow.exc_info or "")
    assert quick.return_value() == "Hi there, Stranger!"
