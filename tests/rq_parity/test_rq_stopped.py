"""rq's ``on_stopped``: called when a running job is stopped. rq stops a job with a worker
command (``send_stop_job_command``); runfleet with ``job.cancel()``. The calls differ, so
this one runs on runfleet only (``rf``: the ``rqx`` runfleet side)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runfleet.store.config import Settings
from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side, _runfleet_side
from tests.support.polling import until_sync


@pytest.fixture
def rf(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    monkeypatch.setenv("RQ_PARITY_OUT", str(tmp_path))
    opened: list[Any] = []
    try:
        yield _runfleet_side(settings, opened)
    finally:
        for q in reversed(opened):
            q.close()


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
