"""rq's tests/test_queue.py, ported: each test runs on real rq and on runfleet (conftest ``rqx``).

Only the import, the connection and the worker differ from rq's test; assertions on rq's
Redis keys (``connection.llen(q.key)``) are asserted through the public reads they stand for.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_create_queue(rqx: Side) -> None:
    q = rqx.Queue("my-queue")
    assert q.name == "my-queue"
    assert str(q) == "<Queue my-queue>"


def test_create_default_queue(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.name == "default"


def test_equality(rqx: Side) -> None:
    q1, q2, q3 = rqx.Queue("foo"), rqx.Queue("foo"), rqx.Queue("bar")
    assert q1 == q2
    assert q2 == q1
    assert q1 != q3
    assert q2 != q3
    assert q1 > q3
    with pytest.raises(TypeError):
        q1 == "some string"  # noqa: B015
    with pytest.raises(TypeError):
        q1 < "some string"  # noqa: B015


def test_empty_removes_jobs(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    assert rqx.Job.exists(job.id, connection=rqx.connection)
    q.empty()
    assert not rqx.Job.exists(job.id, connection=rqx.connection)
    assert q.is_empty()


def test_queue_is_empty(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.is_empty() is True
    q.enqueue(fixtures.say_hello)
    assert q.is_empty() is False


def test_queue_delete(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    job2 = q.enqueue(fixtures.say_hello)
    assert len(q.get_job_ids()) == 2
    q.delete()
    assert len(q.get_job_ids()) == 0
    assert not rqx.Job.exists(job.id, connection=rqx.connection)
    assert not rqx.Job.exists(job2.id, connection=rqx.connection)
    assert rqx.Queue.all(connection=rqx.connection) == []


def test_queue_delete_but_keep_jobs(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    job2 = q.enqueue(fixtures.say_hello)
    assert len(q.get_job_ids()) == 2
    q.delete(delete_jobs=False)
    assert len(q.get_job_ids()) == 0
    assert rqx.Job.exists(job.id, connection=rqx.connection)
    assert rqx.Job.exists(job2.id, connection=rqx.connection)
    assert rqx.Queue.all(connection=rqx.connection) == []


def test_position(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    job2 = q.enqueue(fixtures.say_hello)
    job3 = q.enqueue(fixtures.say_hello)
    assert q.get_job_position(job.id) == 0
    assert q.get_job_position(job2.id) == 1
    assert q.get_job_position(job3) == 2
    assert q.get_job_position("no_real_job") is None


def test_remove(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    assert job.id in q.job_ids
    q.remove(job)
    assert job.id not in q.job_ids
    job = q.enqueue(fixtures.say_hello)
    assert job.id in q.job_ids
    q.remove(job.id)
    assert job.id not in q.job_ids


def test_jobs(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.jobs == []
    job = q.enqueue(fixtures.say_hello)
    assert q.jobs == [job]
    job.delete()
    assert q.job_ids == []


@pytest.mark.rq_difference(
    "runfleet checks arguments at enqueue: say_hello takes no foo= (InvalidInput); rq fails the job"
    " when it runs (docs/how-to/moving-from-rq.md)"
)
def test_enqueue(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.is_empty() is True
    job = q.enqueue(fixtures.say_hello, "Nick", foo="bar")
    assert job.origin == q.name
    assert q.count == 1 and q.job_ids == [job.id]


@pytest.mark.rq_difference(
    "runfleet checks arguments at enqueue: say_hello takes no foo= (InvalidInput); rq fails the job"
    " when it runs (docs/how-to/moving-from-rq.md)"
)
def test_enqueue_sets_metadata(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Nick", foo="bar")
    assert job.enqueued_at is not None
    assert job.get_status() == rqx.JobStatus.QUEUED
    assert job.args == ("Nick",) and job.kwargs == {"foo": "bar"}


def test_enqueue_with_ttl(rqx: Side) -> None:
    q = rqx.Queue()
    with pytest.raises(ValueError):
        q.enqueue(fixtures.echo, 1, ttl=0)
    with pytest.raises(ValueError):
        q.enqueue(fixtures.echo, 1, ttl=-1)


def test_enqueue_sets_status(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    assert job.get_status() == rqx.JobStatus.QUEUED


def test_enqueue_meta_arg(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, meta={"foo": "bar", "baz": 42})
    assert job.meta["foo"] == "bar"
    assert job.meta["baz"] == 42


def test_enqueue_with_failure_ttl(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, failure_ttl=10)
    job.refresh()
    assert job.failure_ttl == 10


def test_job_timeout(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.echo, 1, job_timeout=15)
    assert job.timeout == 15
    with pytest.raises(ValueError):
        q.enqueue(fixtures.echo, 1, job_timeout=0)


def test_synchronous_ended_at(rqx: Side) -> None:
    q = rqx.Queue(is_async=False)
    echo_job = q.enqueue(fixtures.echo)
    assert echo_job.ended_at is not None


def test_enqueue_explicit_args(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.echo, 1, job_timeout=1, result_ttl=1, bar="baz")
    assert job.timeout == 1
    assert job.result_ttl == 1
    assert job.perform() == ((1,), {"bar": "baz"})

    kwargs = {"timeout": 1, "result_ttl": 1}
    job = q.enqueue(fixtures.echo, job_timeout=2, result_ttl=2, args=[1], kwargs=kwargs)
    assert job.timeout == 2
    assert job.result_ttl == 2
    assert job.perform() == ((1,), {"timeout": 1, "result_ttl": 1})

    time = datetime.now(UTC) + timedelta(seconds=10)
    job = q.enqueue_at(time, fixtures.echo, job_timeout=2, result_ttl=2, args=[1], kwargs=kwargs)
    assert job.timeout == 2
    assert job.result_ttl == 2
    assert job.perform() == ((1,), {"timeout": 1, "result_ttl": 1})

    with pytest.raises(Exception):  # noqa: B017 - rq's assertRaises(Exception)
        q.enqueue(fixtures.echo, 1, kwargs=kwargs)


def test_all_queues(rqx: Side) -> None:
    q1, q2, q3 = rqx.Queue("first-queue"), rqx.Queue("second-queue"), rqx.Queue("third-queue")
    assert len(rqx.Queue.all(connection=rqx.connection)) == 0
    q1.enqueue(fixtures.say_hello)
    assert len(rqx.Queue.all(connection=rqx.connection)) == 1
    q2.enqueue(fixtures.say_hello)
    q3.enqueue(fixtures.say_hello)
    names = [q.name for q in rqx.Queue.all(connection=rqx.connection)]
    assert len(names) == 3
    assert {"first-queue", "second-queue", "third-queue"} == set(names)
    rqx.work(q2, q3)
    assert len(rqx.Queue.all(connection=rqx.connection)) == 3


def test_all_queues_with_only_deferred_jobs(rqx: Side) -> None:
    with_queued = rqx.Queue("queue_with_queued_jobs")
    with_deferred = rqx.Queue("queue_with_deferred_jobs")
    parent_job = with_queued.enqueue(fixtures.say_hello)
    with_deferred.enqueue(fixtures.say_hello, depends_on=parent_job)
    names = [q.name for q in rqx.Queue.all(connection=rqx.connection)]
    assert len(names) == 2
    assert "queue_with_deferred_jobs" in names


def test_enqueue_dependents(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job_1 = q.enqueue(fixtures.say_hello, depends_on=parent_job)
    job_2 = q.enqueue(fixtures.say_hello, depends_on=parent_job)
    registry = q.deferred_job_registry
    assert set(registry.get_job_ids()) == {job_1.id, job_2.id}
    rqx.work(q)
    assert job_1.get_status() == rqx.JobStatus.FINISHED
    assert job_2.get_status() == rqx.JobStatus.FINISHED
    assert registry.get_job_ids() == []


def test_enqueue_dependents_on_multiple_queues(rqx: Side) -> None:
    q_1, q_2 = rqx.Queue("queue_1"), rqx.Queue("queue_2")
    parent_job = q_1.enqueue(fixtures.say_hello)
    job_1 = q_1.enqueue(fixtures.say_hello, depends_on=parent_job)
    job_2 = q_2.enqueue(fixtures.say_hello, depends_on=parent_job)
    assert q_1.deferred_job_registry.get_job_ids() == [job_1.id]
    assert q_2.deferred_job_registry.get_job_ids() == [job_2.id]
    rqx.work(q_1, q_2)
    assert job_1.get_status() == rqx.JobStatus.FINISHED
    assert job_2.get_status() == rqx.JobStatus.FINISHED


def test_enqueue_job_with_dependency(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job)
    assert q.job_ids == [parent_job.id]
    assert job.get_status() == rqx.JobStatus.DEFERRED
    rqx.work(q)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job)
    assert q.job_ids == [job.id]
    assert job.get_status() == rqx.JobStatus.QUEUED


def test_enqueue_job_with_dependency_by_id(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    q.enqueue_call(fixtures.say_hello, depends_on=parent_job.id)
    assert q.job_ids == [parent_job.id]
    rqx.work(q)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job.id)
    assert q.job_ids == [job.id]


def test_enqueue_job_with_dependency_and_timeout(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job, timeout=123)
    assert q.job_ids == [parent_job.id]
    assert job.timeout == 123
    rqx.work(q)
    job = q.enqueue_call(fixtures.say_hello, depends_on=parent_job, timeout=123)
    assert q.job_ids == [job.id]
    assert job.timeout == 123


def test_enqueue_many_internal_pipeline(rqx: Side) -> None:
    q = rqx.Queue()
    jobs = q.enqueue_many(
        [
            rqx.Queue.prepare_data(fixtures.say_hello, job_id="fake_job_id_1"),
            rqx.Queue.prepare_data(fixtures.say_hello, job_id="fake_job_id_2"),
            rqx.Queue.prepare_data(fixtures.say_hello, job_id="fake_job_id_3"),
        ]
    )
    assert len(q) == 3
    assert [j.id for j in jobs] == ["fake_job_id_1", "fake_job_id_2", "fake_job_id_3"]
    assert q.job_ids == ["fake_job_id_1", "fake_job_id_2", "fake_job_id_3"]


def test_fetch_job_successful(rqx: Side) -> None:
    q = rqx.Queue()
    job_orig = q.enqueue(fixtures.say_hello)
    job_fetch = q.fetch_job(job_orig.id)
    assert job_fetch is not None
    assert job_orig.id == job_fetch.id
    assert job_orig.description == job_fetch.description


def test_fetch_job_missing(rqx: Side) -> None:
    q = rqx.Queue()
    assert q.fetch_job("123") is None


def test_fetch_job_different_queue(rqx: Side) -> None:
    q1, q2 = rqx.Queue("example1"), rqx.Queue("example2")
    job_orig = q1.enqueue(fixtures.say_hello)
    assert q2.fetch_job(job_orig.id) is None
    assert q1.fetch_job(job_orig.id) is not None


def test_getting_registries(rqx: Side) -> None:
    queue = rqx.Queue()
    r = rqx.registry
    assert queue.scheduled_job_registry == r.ScheduledJobRegistry(queue=queue)
    assert queue.started_job_registry == r.StartedJobRegistry(queue=queue)
    assert queue.failed_job_registry == r.FailedJobRegistry(queue=queue)
    assert queue.deferred_job_registry == r.DeferredJobRegistry(queue=queue)
    assert queue.finished_job_registry == r.FinishedJobRegistry(queue=queue)
    assert queue.canceled_job_registry == r.CanceledJobRegistry(queue=queue)


def test_enqueue_with_retry(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, retry=rqx.Retry(max=3, interval=5))
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.retries_left == 3
    assert job.retry_intervals == [5]


def test_enqueue_at(rqx: Side) -> None:
    queue = rqx.Queue()
    scheduled_time = datetime.now(UTC) + timedelta(seconds=10)
    job = queue.enqueue_at(scheduled_time, fixtures.say_hello)
    registry = rqx.registry.ScheduledJobRegistry(queue=queue)
    assert job in registry
    assert registry.get_expiration_time(job) == scheduled_time.replace(microsecond=0)


def test_job_past_its_timeout_fails(rqx: Side) -> None:
    """rq's tests/test_timeouts.py pattern: a job over ``job_timeout`` fails with
    JobTimeoutException and is in the failed registry (not cancelled)."""
    import time

    q = rqx.Queue()
    job = q.enqueue(fixtures.spin, 10, job_timeout=1)
    started = time.monotonic()
    rqx.work(q)
    assert time.monotonic() - started < 8
    assert job.get_status() == rqx.JobStatus.FAILED
    assert job.exc_info is not None and "JobTimeoutException" in job.exc_info
    assert job in q.failed_job_registry
    fine = q.enqueue(fixtures.spin, 0.1, job_timeout=5)
    rqx.work(q)
    assert fine.return_value() == "done"


def test_dotted_string_function(rqx: Side) -> None:
    """rq's ``q.enqueue('module.func', ...)`` (tests/test_job.py create_job_from_string)."""
    q = rqx.Queue()
    job = q.enqueue("tests.rq_parity.rq_fixtures.say_hello", "Ann")
    rqx.work(q)
    assert job.return_value() == "Hi there, Ann!"


def test_requeued_job_keeps_its_id_in_the_queue(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.div_by_zero, job_id="keeps")
    rqx.work(q)
    registry = q.failed_job_registry
    registry.requeue(job)
    assert q.job_ids == ["keeps"]
    rqx.work(q)
    assert job in registry and registry.get_job_ids() == ["keeps"]
    assert job.get_status() == rqx.JobStatus.FAILED


def test_meta_is_there_without_refresh(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, meta={"owner": "ann"})
    assert job.meta == {"owner": "ann"}


def test_at_front_jobs_first(rqx: Side) -> None:
    q = rqx.Queue()
    first = q.enqueue(fixtures.say_hello)
    front = q.enqueue(fixtures.say_hello, at_front=True)
    front2 = q.enqueue(fixtures.say_hello, at_front=True)
    assert q.job_ids == [front2.id, front.id, first.id]


def test_enqueue_unique_raises_on_duplicate(rqx: Side) -> None:
    queue = rqx.Queue()
    assert queue.enqueue(fixtures.say_hello, job_id="unique-job", unique=True) is not None
    with pytest.raises(rqx.exceptions.DuplicateJobError, match="unique-job"):
        queue.enqueue(fixtures.say_hello, job_id="unique-job", unique=True)


def test_enqueue_without_unique_allows_duplicate_ids(rqx: Side) -> None:
    queue = rqx.Queue()
    assert queue.enqueue(fixtures.say_hello, job_id="duplicate-job").id == "duplicate-job"
    assert queue.enqueue(fixtures.say_hello, job_id="duplicate-job").id == "duplicate-job"


@pytest.mark.rq_difference(
    "a run id is an idempotency key: a deleted job's id stays taken until runfleet prune"
    " (docs/how-to/moving-from-rq.md)"
)
def test_enqueue_unique_allows_requeue_after_job_deleted(rqx: Side) -> None:
    queue = rqx.Queue()
    job1 = queue.enqueue(fixtures.say_hello, job_id="requeue-job", unique=True)
    job1.delete()
    job2 = queue.enqueue(fixtures.say_hello, job_id="requeue-job", unique=True)
    assert job2.id == "requeue-job"


def test_create_then_enqueue_job(rqx: Side) -> None:
    """rq's tests/test_queue.py (test_enqueue_job): ``Job.create`` then ``enqueue_job``."""
    q = rqx.Queue()
    job = rqx.Job.create(
        fixtures.say_hello, args=("Nick",), connection=rqx.connection, meta={"k": "v"}
    )
    assert q.job_ids == []
    enqueued = q.enqueue_job(job)
    assert enqueued.id == job.id
    assert q.job_ids == [job.id]
    assert enqueued.get_status() == rqx.JobStatus.QUEUED
    rqx.work(q)
    fetched = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert fetched.return_value() == "Hi there, Nick!"
    assert fetched.meta == {"k": "v"}


def test_default_timeout(rqx: Side) -> None:
    """rq's tests/test_queue.py: a job's timeout is the queue's ``default_timeout``, else
    ``Queue.DEFAULT_TIMEOUT`` (180 s); past it the job fails with JobTimeoutException."""
    assert rqx.Queue.DEFAULT_TIMEOUT == 180
    assert rqx.Queue().enqueue(fixtures.say_hello).timeout == 180
    q = rqx.Queue("short", default_timeout=1)
    assert q.enqueue(fixtures.say_hello, job_timeout=30).timeout == 30
    job = q.enqueue(fixtures.long_running_job, 4)
    assert job.timeout == 1
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FAILED
    assert "JobTimeoutException" in (job.exc_info or "")
