"""rq's dependents as a queue lists them, ported from rq's tests/test_dependencies.py and
tests/test_job.py: each test runs on real rq and on runfleet (``rqx``).

A dependent that its dependency released is in its queue (``job_ids``, ``len``,
``get_jobs``) and in no deferred registry, whether the release came from the dependency
finishing or from ``cancel(enqueue_dependents=True)``; cancelling a failed job cancels it.
"""

from __future__ import annotations

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_a_dependent_released_by_its_dependency_is_listed_in_its_queue(rqx: Side) -> None:
    first, second = rqx.Queue("first"), rqx.Queue("second")
    dependency = first.enqueue(fixtures.say_hello)
    dependent = second.enqueue(fixtures.say_hello, depends_on=dependency)
    assert second.job_ids == []
    deferred = rqx.registry.DeferredJobRegistry(queue=second, connection=rqx.connection)
    assert dependent.id in deferred.get_job_ids()

    rqx.work(first)  # the dependency finishes; nobody works the second queue

    assert dependent.get_status() == rqx.JobStatus.QUEUED
    assert second.job_ids == [dependent.id]
    assert len(second) == 1
    assert [j.id for j in second.get_jobs()] == [dependent.id]
    assert dependent.id not in deferred.get_job_ids()


def test_cancel_enqueue_dependents_lists_the_dependent_at_once(rqx: Side) -> None:
    first, second = rqx.Queue("first"), rqx.Queue("second")
    dependency = first.enqueue(fixtures.say_hello)
    dependent = second.enqueue(fixtures.say_hello, depends_on=dependency)

    rqx.cancel_job(dependency.id, connection=rqx.connection, enqueue_dependents=True)

    assert dependent.get_status() == rqx.JobStatus.QUEUED
    assert second.job_ids == [dependent.id]
    deferred = rqx.registry.DeferredJobRegistry(queue=second, connection=rqx.connection)
    assert dependent.id not in deferred.get_job_ids()
    rqx.work(second)
    assert dependent.get_status() == rqx.JobStatus.FINISHED


def test_cancelling_a_failed_job_cancels_it(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.div_by_zero, 1)
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FAILED

    rqx.cancel_job(job.id, connection=rqx.connection)

    assert job.get_status() == rqx.JobStatus.CANCELED
    canceled = rqx.registry.CanceledJobRegistry(queue=q, connection=rqx.connection)
    assert job.id in canceled.get_job_ids()
    failed = rqx.registry.FailedJobRegistry(queue=q, connection=rqx.connection)
    assert job.id not in failed.get_job_ids()


def test_cancel_remove_from_dependencies(rqx: Side) -> None:
    """rq's tests/test_job.py: a dependent cancelled with ``remove_from_dependencies`` leaves
    its dependency's ``dependent_ids``; one cancelled without it stays there."""
    q = rqx.Queue()
    dependency = q.enqueue(fixtures.say_hello)
    kept = q.enqueue(fixtures.say_hello, depends_on=dependency)
    removed = q.enqueue(fixtures.say_hello, depends_on=dependency)
    kept.cancel()
    removed.cancel(remove_from_dependencies=True)
    dependency.refresh()
    assert dependency.dependent_ids == [kept.id]
