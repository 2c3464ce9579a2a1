"""rq's tests/test_dependencies.py, ported: each test runs on real rq and on runfleet (``rqx``)."""

from __future__ import annotations

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_allow_failure_is_persisted(rqx: Side) -> None:
    q = rqx.Queue()
    dep_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue(fixtures.say_hello, depends_on=rqx.Dependency([dep_job]))
    assert rqx.Job.fetch(job.id, connection=rqx.connection).allow_dependency_failures is False
    job = q.enqueue(fixtures.say_hello, depends_on=rqx.Dependency([dep_job], allow_failure=True))
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.allow_dependency_failures is True
    jobs = rqx.Job.fetch_many([job.id], connection=rqx.connection)
    assert jobs[0].allow_dependency_failures is True


def test_job_dependency(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job)
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() == rqx.JobStatus.FINISHED
    q.empty()

    parent_job = q.enqueue(fixtures.div_by_zero)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job)
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() != rqx.JobStatus.FINISHED
    q.empty()

    parent_job = q.enqueue(fixtures.div_by_zero)
    job = q.enqueue_call(fixtures.say_hello, depends_on=rqx.Dependency(jobs=parent_job))
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() != rqx.JobStatus.FINISHED

    parent_job = q.enqueue(fixtures.div_by_zero)
    dependency = rqx.Dependency(jobs=parent_job, allow_failure=True)
    job = q.enqueue_call(fixtures.say_hello, depends_on=dependency)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.allow_dependency_failures
    rqx.work(q)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() == rqx.JobStatus.FINISHED


def test_multiple_jobs_with_dependencies(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job_no_deps = rqx.Queue.prepare_data(fixtures.say_hello)
    job_with_deps = rqx.Queue.prepare_data(fixtures.say_hello, depends_on=parent_job)
    jobs = q.enqueue_many([job_no_deps, job_with_deps])
    assert jobs[0].get_status() == rqx.JobStatus.QUEUED
    assert jobs[1].get_status() == rqx.JobStatus.DEFERRED
    rqx.work(q)
    job_with_met_deps = rqx.Queue.prepare_data(fixtures.say_hello, depends_on=parent_job)
    jobs = q.enqueue_many([job_with_met_deps])
    assert jobs[0].get_status() == rqx.JobStatus.QUEUED


def test_dependency_list_in_depends_on(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job1 = q.enqueue(fixtures.say_hello)
    parent_job2 = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(
        fixtures.say_hello,
        depends_on=[rqx.Dependency([parent_job1]), rqx.Dependency([parent_job2])],
    )
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED


def test_a_chain_of_three(rqx: Side) -> None:
    """rq's documented A <- B <- C chain (docs/jobs: depends_on), run to the end."""
    q = rqx.Queue()
    a = q.enqueue(fixtures.long_running_job, 2.5)
    b = q.enqueue(fixtures.say_hello, "B", depends_on=a)
    c = q.enqueue(fixtures.say_hello, "C", depends_on=b)
    assert b.get_status() == rqx.JobStatus.DEFERRED and c.get_status() == rqx.JobStatus.DEFERRED
    rqx.work(q)
    assert [j.get_status() for j in (a, b, c)] == [rqx.JobStatus.FINISHED] * 3
    assert c.return_value() == "Hi there, C!"


def test_dependencies_are_met_if_parent_is_canceled(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    job.cancel()
    dependent_job = queue.enqueue(fixtures.say_hello, depends_on=job)
    assert not dependent_job.dependencies_are_met()


def test_can_enqueue_job_if_dependency_is_deleted(rqx: Side) -> None:
    queue = rqx.Queue()
    dependency_job = queue.enqueue(fixtures.say_hello)
    rqx.work(queue)
    dependency_job.delete()
    assert queue.enqueue(fixtures.say_hello, depends_on=dependency_job)


def test_dependencies_are_met_at_execution_time(rqx: Side) -> None:
    queue = rqx.Queue()
    queue.enqueue(fixtures.say_hello, job_id="A")
    queue.enqueue(fixtures.say_hello, job_id="B")
    job_c = queue.enqueue(fixtures.check_dependencies_are_met, job_id="C", depends_on=["A", "B"])
    assert not job_c.dependencies_are_met()
    rqx.work(queue)
    assert job_c.return_value(refresh=True)


def test_dependency_accepts_single_job(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(fixtures.say_hello, depends_on=rqx.Dependency(parent_job))
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED
    q.empty()

    parent_job = q.enqueue(fixtures.div_by_zero)
    job = q.enqueue_call(
        fixtures.say_hello, depends_on=rqx.Dependency(parent_job, allow_failure=True)
    )
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED
    q.empty()

    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(fixtures.say_hello, depends_on=rqx.Dependency(parent_job.id))
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED


def test_dependency_ids_and_dependent_ids(rqx: Side) -> None:
    q = rqx.Queue()
    parent = q.enqueue(fixtures.say_hello)
    child = q.enqueue(fixtures.say_hello, depends_on=parent)
    assert child.dependency_ids == [parent.id]
    parent.refresh()
    assert parent.dependent_ids == [child.id]


def test_cancel_enqueue_dependents(rqx: Side) -> None:
    q = rqx.Queue()
    parent = q.enqueue(fixtures.say_hello)
    child = q.enqueue(fixtures.say_hello, depends_on=rqx.Dependency(parent, allow_failure=True))
    parent.cancel(enqueue_dependents=True)
    assert parent.get_status() == rqx.JobStatus.CANCELED
    rqx.work(q)
    assert child.get_status() == rqx.JobStatus.FINISHED
