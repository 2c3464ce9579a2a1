"""rq's tests/test_commands.py, the part a producer's code observes, ported: each test runs
on real rq (a forking ``rq worker``, as ``stop-job`` needs) and on runfleet (``rqx``)."""

from __future__ import annotations

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side
from tests.support.polling import until_sync


def test_stop_job_command(rqx: Side) -> None:
    queue = rqx.Queue("foo")
    job = queue.enqueue(fixtures.long_running_job, 10)
    with pytest.raises(rqx.exceptions.InvalidJobOperation):  # not executing yet
        rqx.send_stop_job_command(rqx.connection, job_id=job.id)
    with pytest.raises(rqx.exceptions.NoSuchJobError):
        rqx.send_stop_job_command(rqx.connection, job_id="1")

    worker = rqx.work_forking_in_background(queue)
    until_sync(lambda: job.get_status() == rqx.JobStatus.STARTED, 30, "the job to start")
    rqx.send_stop_job_command(rqx.connection, job_id=job.id)

    until_sync(lambda: job.is_stopped, 10, "the job to read stopped")
    worker.join(30)  # the worker goes on (here: ends its burst) instead of waiting 10 s
    assert job.get_status() == rqx.JobStatus.STOPPED
    assert job.return_value() is None
