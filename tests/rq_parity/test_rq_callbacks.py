"""rq's tests/test_callbacks.py, ported: each test runs on real rq and on runfleet (``rqx``).

rq's fixtures save what a callback saw in Redis; these save it in files (``rq_fixtures``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_enqueue_with_success_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    with pytest.raises(ValueError):
        queue.enqueue(fixtures.say_hello, on_success=rqx.Job.fetch)
    job = queue.enqueue(fixtures.say_hello, on_success=print)
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.success_callback == print
    job = queue.enqueue_in(timedelta(seconds=10), fixtures.say_hello, on_success=print)
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.success_callback == print
    job = queue.enqueue(fixtures.say_hello, on_success=rqx.Callback("print"))
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.success_callback == print


def test_enqueue_with_failure_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    with pytest.raises(ValueError):
        queue.enqueue(fixtures.say_hello, on_failure=rqx.Job.fetch)
    job = queue.enqueue(fixtures.say_hello, on_failure=print)
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.failure_callback == print
    job = queue.enqueue(fixtures.say_hello, on_failure=rqx.Callback("print"))
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.failure_callback == print


def test_enqueue_with_stopped_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.long_running_job, on_stopped=print)
    job = rqx.Job.fetch(id=job.id, connection=rqx.connection)
    assert job.stopped_callback == print


def test_enqueue_many_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job_data = rqx.Queue.prepare_data(
        func=fixtures.say_hello, on_success=print, on_failure=fixtures.save_exception
    )
    jobs = queue.enqueue_many([job_data])
    assert jobs[0].success_callback == print
    assert jobs[0].failure_callback == fixtures.save_exception


def test_success_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, on_success=fixtures.save_result)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert fixtures.saved(f"success_callback:{job.id}") == job.return_value()

    job = queue.enqueue(fixtures.div_by_zero, on_success=fixtures.save_result)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert fixtures.saved(f"success_callback:{job.id}") is None

    job = queue.enqueue(
        fixtures.say_hello, on_success=rqx.Callback("tests.rq_parity.rq_fixtures.save_result")
    )
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert fixtures.saved(f"success_callback:{job.id}") == job.return_value()


def test_erroneous_success_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, on_success=fixtures.erroneous_callback)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    job = queue.enqueue(
        fixtures.say_hello,
        on_success=rqx.Callback("tests.rq_parity.rq_fixtures.erroneous_callback"),
    )
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED


def test_failure_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.div_by_zero, on_failure=fixtures.save_exception)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    saved = fixtures.saved(f"failure_callback:{job.id}")
    assert saved is not None and "div_by_zero" in saved and "division by zero" in saved

    job = queue.enqueue(fixtures.div_by_zero, on_success=fixtures.save_result)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert fixtures.saved(f"failure_callback:{job.id}") is None


def test_job_status_set_before_success_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, on_success=fixtures.save_status_on_success)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert fixtures.saved(f"success_callback_status:{job.id}") == "finished"


def test_job_status_set_before_failure_callback(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.div_by_zero, on_failure=fixtures.save_status_on_failure)
    rqx.work(queue)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert fixtures.saved(f"failure_callback_status:{job.id}") == "failed"


def test_sync_success_callback(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = queue.enqueue(fixtures.say_hello, on_success=fixtures.save_result)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert fixtures.saved(f"success_callback:{job.id}") == job.result

    job = queue.enqueue(fixtures.div_by_zero, on_success=fixtures.save_result)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert fixtures.saved(f"success_callback:{job.id}") is None

    job = queue.enqueue(
        fixtures.say_hello, on_success=rqx.Callback("tests.rq_parity.rq_fixtures.save_result")
    )
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert fixtures.saved(f"success_callback:{job.id}") == job.result


def test_sync_failure_callback(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = queue.enqueue(fixtures.div_by_zero, on_failure=fixtures.save_exception)
    assert job.get_status() == rqx.JobStatus.FAILED
    saved = fixtures.saved(f"failure_callback:{job.id}")
    assert saved is not None and "division by zero" in saved
