"""rq's depends_on: a dependent runs only after its dependencies completed; a failed
dependency leaves it deferred until the dependency is requeued and completes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import runfleet.rqface.running
from runfleet.producer import RunNotFound
from runfleet.rqface import Queue
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from tests.fleet.flows import sleepy
from tests.rq_parity import jobs
from tests.rq_parity.conftest import ThreadWorker
from tests.support.polling import until_sync


@pytest.fixture
def q(settings: Settings, thread_worker: ThreadWorker) -> Iterator[Queue]:
    thread_worker.start()
    with Queue("default", settings=settings) as queue:
        yield queue


def test_a_chain_runs_in_order(q: Queue, tmp_path: Path) -> None:
    path = str(tmp_path / "order")
    a = q.enqueue(jobs.snooze, 1.0)
    b = q.enqueue(jobs.record, path, "b", depends_on=a)
    c = q.enqueue(jobs.record, path, "c", depends_on=[b.id])
    assert b.is_deferred and c.is_deferred  # a is still sleeping
    assert b.id not in q.job_ids and c.id not in q.job_ids
    assert c.wait(30) == "bc"
    assert a.is_finished and b.is_finished and c.is_finished
    assert a.ended_at and b.started_at and b.ended_at and c.started_at
    # started_at is when the run was first taken; the function itself ran after the gate
    assert Path(path).read_text() == "bc"


def test_a_failed_dependency_leaves_the_dependent_deferred(
    q: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runfleet.rqface.running, "DEPENDENCY_POLL_BROKEN", 0.3)
    marker = tmp_path / "fixed"
    dependency = q.enqueue(jobs.fail_unless_exists, str(marker))
    dependent = q.enqueue(jobs.add, 1, 2, depends_on=dependency)
    until_sync(lambda: dependency.is_failed, 20, "the dependency to fail")
    held_until = time.monotonic() + 1.5
    while time.monotonic() < held_until:  # several looks at the failed dependency
        assert dependent.is_deferred
        time.sleep(0.1)
    marker.write_text("")
    q.failed_job_registry.requeue(dependency.id)
    assert dependent.wait(30) == 3
    assert dependency.is_finished and dependent.is_finished


def test_depends_on_is_checked_at_enqueue(q: Queue) -> None:
    with pytest.raises(RunNotFound):
        q.enqueue(jobs.add, 1, 2, depends_on="no-such-job")
    first = q.enqueue(jobs.add, 1, 1)
    with pytest.raises(InvalidInput, match="depends_on"):
        q.enqueue(sleepy, 10, depends_on=first)
