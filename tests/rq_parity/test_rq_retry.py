"""rq's tests/test_retry.py, ported: each test runs on real rq and on runfleet (``rqx``)."""

from __future__ import annotations

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side
from tests.support.polling import until_sync


def test_retry_class(rqx: Side) -> None:
    retry = rqx.Retry(max=1)
    assert retry.max == 1
    assert retry.intervals == [0]
    assert retry.enqueue_at_front is False
    with pytest.raises(ValueError):
        rqx.Retry(max=0)
    retry = rqx.Retry(max=2, interval=5)
    assert retry.max == 2 and retry.intervals == [5]
    retry = rqx.Retry(max=3, interval=[5, 10])
    assert retry.max == 3 and retry.intervals == [5, 10]
    retry = rqx.Retry(max=1, enqueue_at_front=True)
    assert retry.intervals == [0] and retry.enqueue_at_front is True
    with pytest.raises(ValueError):
        rqx.Retry(max=1, interval=-5)
    with pytest.raises(ValueError):
        rqx.Retry(max=1, interval=[1, -5])


def test_retry_repr(rqx: Side) -> None:
    assert repr(rqx.Retry(max=1)) == "Retry(max=1, interval=0, enqueue_at_front=False)"
    assert repr(rqx.Retry(max=2, interval=5)) == "Retry(max=2, interval=5, enqueue_at_front=False)"
    assert (
        repr(rqx.Retry(max=3, interval=[5, 10]))
        == "Retry(max=3, interval=[5, 10], enqueue_at_front=False)"
    )
    assert (
        repr(rqx.Retry(max=1, enqueue_at_front=True))
        == "Retry(max=1, interval=0, enqueue_at_front=True)"
    )


def test_job_create_with_retry(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, retry=rqx.Retry(max=3, interval=5))
    assert job.retries_left == 3
    assert job.retry_intervals == [5]


def test_persistence_of_retry_data(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, retry=rqx.Retry(max=3, interval=[1, 2, 3]))
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.retries_left == 3
    assert job.retry_intervals == [1, 2, 3]


def test_worker_handles_max_retry(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.div_by_zero, retry=rqx.Retry(max=2))
    rqx.work(queue)
    job.refresh()
    assert job.get_status() == rqx.JobStatus.FAILED
    assert job.retries_left == 0
    assert job in queue.failed_job_registry


def test_retry_then_success(rqx: Side, tmp_path: object) -> None:
    """A job that fails twice then succeeds, under Retry(max=3): finished, with its value."""
    import os

    from tests.rq_parity import jobs

    queue = rqx.Queue()
    path = os.path.join(os.environ["RQ_PARITY_OUT"], "tries")
    job = queue.enqueue(jobs.flaky, path, 2, retry=rqx.Retry(max=3))
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert job.return_value() == 3


def test_get_interval(rqx: Side) -> None:
    """rq's tests/test_retry.py: ``Retry.get_interval(count, intervals)``."""
    assert rqx.Retry.get_interval(0, [1, 2, 3]) == 1
    assert rqx.Retry.get_interval(1, [1, 2, 3]) == 2
    assert rqx.Retry.get_interval(3, [1, 2, 3]) == 3
    assert rqx.Retry.get_interval(4, [1, 2, 3]) == 3
    assert rqx.Retry.get_interval(4, 5) == 5
    assert rqx.Retry.get_interval(0, []) == 0
    assert rqx.Retry.get_interval(0, None) == 0


def test_a_job_returning_retry_runs_again(rqx: Side) -> None:
    """rq's tests/test_retry.py (a job returns ``Retry``): it runs again until it returns
    something else; past the Retry's ``max`` it fails."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.returns_retry, f"again-{rqx.name}", 2)
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert job.return_value() == "done after 3"

    exhausted = q.enqueue(fixtures.returns_retry, f"exhausted-{rqx.name}", 10, 1)
    rqx.work(q)
    assert exhausted.get_status() == rqx.JobStatus.FAILED
    assert fixtures.saved(f"returns_retry:exhausted-{rqx.name}") == "2"


def test_a_job_waiting_out_its_retry_interval_is_scheduled(rqx: Side) -> None:
    """rq's tests/test_worker.py (retry with an interval): between a failure and its retry
    the job reads ``scheduled`` and is in the scheduled registry, not the started one."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.div_by_zero, retry=rqx.Retry(max=1, interval=30))
    worker = rqx.work_in_background(q)
    scheduled = rqx.registry.ScheduledJobRegistry(queue=q, connection=rqx.connection)
    started = rqx.registry.StartedJobRegistry(queue=q, connection=rqx.connection)
    # rq sets the status a moment before its pipeline adds the job to the registry
    until_sync(lambda: job.id in scheduled.get_job_ids(), 30, "the retry's schedule")
    assert job.get_status() == rqx.JobStatus.SCHEDULED
    assert job.id not in started.get_job_ids()
    assert job.id not in q.job_ids
    if rqx.name == "runfleet":
        rqx.cancel_job(job.id, connection=rqx.connection)  # lets the burst worker end
    worker.join(60)
