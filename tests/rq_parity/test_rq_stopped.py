"""rq's ``on_stopped``: called when a running job is stopped. rq stops a job with a worker
command (``send_stop_job_command``); runfleet with ``job.cancel()``. The calls differ, so
this one runs on runfleet only (``rf``: the ``rqx`` runfleet side)."""

from __future__ import annotations

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side
from tests.support.polling import until_sync


def test_on_stopped_runs_when_a_running_job_is_cancelled(rf: Side) -> None:
    q = rf.Queue()
    job = q.enqueue(fixtures.spin, 2, on_stopped=fixtures.save_stopped)
    worker = rf.work_in_background(q)
    until_sync(lambda: job.get_status() == rf.JobStatus.STARTED, 30, "the job to start")
    job.cancel()
    worker.join(60)
    assert job.get_status() == rf.JobStatus.CANCELED
    assert fixtures.saved(f"stopped_callback:{job.id}") == "canceled"
    done = q.enqueue(fixtures.say_hello, on_stopped=fixtures.save_stopped)
    rf.work(q)
    assert done.get_status() == rf.JobStatus.FINISHED
    assert fixtures.saved(f"stopped_callback:{done.id}") is None  # not stopped: not called
