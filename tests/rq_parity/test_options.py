"""rq's retry= and on_success= / on_failure= for a plain function, executed by a worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfleet.producer import Retry
from runfleet.rqface import Queue
from runfleet.store.config import Settings
from tests.rq_parity import jobs
from tests.rq_parity.conftest import ThreadWorker
from tests.support.polling import until_sync


@pytest.fixture
def q(settings: Settings, thread_worker: ThreadWorker) -> Iterator[Queue]:
    thread_worker.start()
    with Queue("default", settings=settings) as queue:
        yield queue


def test_retry_with_intervals_then_on_success(q: Queue, tmp_path: Path) -> None:
    path = str(tmp_path / "tries")
    started = time.monotonic()
    job = q.enqueue(
        jobs.flaky,
        path,
        2,
        retry=Retry(max=3, interval=[0.3, 0.6]),
        on_success=jobs.report_success,
        on_failure=jobs.report_failure,
    )
    assert job.wait(30) == 3
    assert time.monotonic() - started >= 0.9  # waited 0.3 s, then 0.6 s, between tries
    assert json.loads(Path(f"{path}.success").read_text()) == {"id": job.id, "result": 3}
    assert not Path(f"{path}.failure").exists()


def test_retries_exhausted_then_on_failure(q: Queue, tmp_path: Path) -> None:
    path = str(tmp_path / "tries")
    job = q.enqueue(jobs.flaky, path, 5, retry=Retry(max=1), on_failure=jobs.report_failure)
    until_sync(lambda: job.is_failed, 30, "the job to fail")
    assert Path(path).read_text() == "2"  # one try and one retry
    failure = json.loads(Path(f"{path}.failure").read_text())
    assert failure == {"id": job.id, "error": "RuntimeError", "message": "try 2 of 6"}
    assert job.exc_info is not None and "RuntimeError" in job.exc_info


def test_a_raising_success_callback_fails_the_job(q: Queue, tmp_path: Path) -> None:
    job = q.enqueue(jobs.add, 1, 2, on_success=jobs.fail)  # fail(job, ...) -> TypeError
    until_sync(lambda: job.is_failed, 30, "the job to fail")
