"""rq's tests/test_results.py, ported: each test runs on real rq and on runfleet (``rqx``).

rq's ``Result.create(...)`` writes a result by hand; these ports let a worker write it.
"""

from __future__ import annotations

import time

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_job_successful_result(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    assert job.latest_result() is None
    rqx.work(queue)
    result = job.latest_result()
    assert result is not None
    assert result.type == result.Type.SUCCESSFUL
    assert result.return_value == "Hi there, Stranger!"
    assert job.return_value() == "Hi there, Stranger!"


def test_job_failed_result(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.div_by_zero)
    rqx.work(queue)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.exc_info is not None and "ZeroDivisionError" in job.exc_info
    result = job.latest_result()
    assert result.type == result.Type.FAILED
    assert "ZeroDivisionError" in result.exc_string


def test_job_return_value(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    assert job.return_value() is None
    rqx.work(queue)
    assert job.return_value() == "Hi there, Stranger!"
    job = queue.enqueue(fixtures.div_by_zero)
    rqx.work(queue)
    assert job.return_value(refresh=True) is None


def test_job_return_value_sync(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = queue.enqueue(fixtures.say_hello)
    assert job.return_value() is not None
    job = queue.enqueue(fixtures.div_by_zero)
    assert job.latest_result().type == job.latest_result().Type.FAILED


def test_blocking_results(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    assert job.latest_result() is None
    started_at = time.time()
    assert job.latest_result(timeout=1) is None
    assert time.time() - started_at >= 1
    rqx.work(queue)
    result_sync = job.latest_result()
    started_at = time.time()
    result_blocking = job.latest_result(timeout=1)
    assert result_sync.return_value == result_blocking.return_value
    assert time.time() - started_at < 1


def test_results_list(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    rqx.work(queue)
    results = job.results()
    assert len(results) == 1
    assert results[0].return_value == "Hi there, Stranger!"


def test_job_return_value_result_ttl_zero(rqx: Side) -> None:
    """result_ttl=0: the job is gone once it finished (rq deletes its key at once)."""
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, result_ttl=0)
    assert job.return_value() is None
    rqx.work(queue)
    assert not rqx.Job.exists(job.id, connection=rqx.connection)
    assert job.id not in queue.finished_job_registry


def test_job_return_value_result_ttl_infinity(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, result_ttl=-1)
    rqx.work(queue)
    assert job.return_value() == "Hi there, Stranger!"
    assert job in queue.finished_job_registry


def test_results_keep_every_execution_of_a_requeued_job(rqx: Side) -> None:
    """rq's ``job.results()``: one Result per execution, newest first, across a requeue."""
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.fail_once, f"results-{rqx.name}-{time.time()}")
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    job.requeue()
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FINISHED

    results = job.results()
    assert [r.type for r in results] == [results[0].Type.SUCCESSFUL, results[0].Type.FAILED]
    assert results[0].return_value == "second time"
    assert "ValueError" in results[1].exc_string
    assert job.latest_result().return_value == "second time"


def test_result_class_reads_and_worker_name(rqx: Side) -> None:
    """rq's tests/test_results.py (test_getting_results, test_count) with a worker writing
    the results: ``Result.fetch_latest``, ``Result.all``, ``Result.count``, and the
    ``worker_name`` of the job and of its result."""
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    assert rqx.Result.count(job) == 0
    assert rqx.Result.fetch_latest(job) is None
    assert not job.worker_name
    rqx.work(queue)

    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    latest = rqx.Result.fetch_latest(job)
    assert latest is not None and latest.type == latest.Type.SUCCESSFUL
    assert latest.return_value == "Hi there, Stranger!"
    assert [r.return_value for r in rqx.Result.all(job)] == ["Hi there, Stranger!"]
    assert rqx.Result.count(job) == 1
    assert job.worker_name
    assert latest.worker_name == job.worker_name
