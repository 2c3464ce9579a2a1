"""rq's tests/test_job.py, ported: each test runs on real rq and on runfleet (conftest ``rqx``).

rq's ``Job.create(...).save()`` is enqueue's job without a queue; these ports enqueue it.
"""

from __future__ import annotations

import time
from uuid import uuid4

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_fetch(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.some_calculation, 3, 4, z=2, job_id="some_id")
    fetched = rqx.Job.fetch("some_id", connection=rqx.connection)
    assert fetched.id == "some_id"
    assert fetched.func_name == "tests.rq_parity.rq_fixtures.some_calculation"
    assert fetched.args == (3, 4)
    assert fetched.kwargs == {"z": 2}
    assert fetched.origin == "default"
    assert fetched == job


def test_fetch_many(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.some_calculation, 3, 4, z=2, job_id="some_id")
    job2 = q.enqueue(fixtures.some_calculation, 5, 4, z=2, job_id="other_id")
    jobs = rqx.Job.fetch_many([job.id, job2.id, "invalid_id"], connection=rqx.connection)
    assert jobs == [job, job2, None]


def test_fetching_can_fail(rqx: Side) -> None:
    with pytest.raises(rqx.exceptions.NoSuchJobError):
        rqx.Job.fetch("b4a44d44-da16-4620-90a6-798e8cd72ca0", connection=rqx.connection)


def test_persistence_of_typical_jobs(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.some_calculation, 3, 4, z=2)
    fetched = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert fetched.description == "tests.rq_parity.rq_fixtures.some_calculation(3, 4, z=2)"
    assert fetched.enqueued_at is not None
    assert fetched.get_status() == rqx.JobStatus.QUEUED


def test_persistence_of_parent_job(rqx: Side) -> None:
    q = rqx.Queue()
    parent_job = q.enqueue(fixtures.say_hello)
    job = q.enqueue(fixtures.say_hello, depends_on=parent_job)
    stored_job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert stored_job._dependency_id == parent_job.id
    assert stored_job._dependency_ids == [parent_job.id]
    assert stored_job.dependency_ids == [parent_job.id]
    assert stored_job.dependency.id == parent_job.id


def test_persistence_of_callbacks(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(
        fixtures.say_hello,
        on_success=rqx.Callback(fixtures.save_result, timeout=10),
        on_failure=fixtures.save_exception,
    )
    stored_job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert stored_job.success_callback == fixtures.save_result
    assert stored_job.success_callback_timeout == 10
    assert stored_job.failure_callback == fixtures.save_exception


def test_custom_meta_is_persisted(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel")
    job.meta["foo"] = "bar"
    job.save()
    job2 = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job2.meta["foo"] == "bar"


def test_get_meta(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel")
    job.meta["foo"] = "bar"
    job.save()
    assert job.get_meta()["foo"] == "bar"
    other = rqx.Job.fetch(job.id, connection=rqx.connection)
    other.meta = {"fee": "boo"}
    other.save_meta()
    assert job.get_meta(False)["foo"] == "bar"  # refresh=False keeps what it had
    assert job.get_meta()["fee"] == "boo"


def test_custom_meta_is_rewriten_by_save_meta(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel")
    job.meta["foo"] = "bar"
    job.save_meta()
    job2 = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job2.meta["foo"] == "bar"
    assert job2.args == ("Lionel",) and job2.func_name == job.func_name


def test_result_ttl_is_persisted(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel", result_ttl=10)
    assert rqx.Job.fetch(job.id, connection=rqx.connection).result_ttl == 10
    job = q.enqueue(fixtures.say_hello, "Lionel")
    assert rqx.Job.fetch(job.id, connection=rqx.connection).result_ttl is None


def test_failure_ttl_is_persisted(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel", failure_ttl=15)
    assert rqx.Job.fetch(job.id, connection=rqx.connection).failure_ttl == 15
    job = q.enqueue(fixtures.say_hello, "Lionel")
    assert rqx.Job.fetch(job.id, connection=rqx.connection).failure_ttl is None


def test_description_is_persisted(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello, "Lionel", description="Say hello!")
    assert rqx.Job.fetch(job.id, connection=rqx.connection).description == "Say hello!"
    job = q.enqueue(fixtures.say_hello, "Lionel")
    assert (
        rqx.Job.fetch(job.id, connection=rqx.connection).description
        == "tests.rq_parity.rq_fixtures.say_hello('Lionel')"
    )


def test_job_access_outside_job_fails(rqx: Side) -> None:
    assert rqx.get_current_job() is None


def test_job_access_within_job_function(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.access_self)
    rqx.work(q)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert job.return_value() == [job.id]


def test_job_access_within_synchronous_job_function(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = queue.enqueue(fixtures.access_self)
    assert job.return_value() == [job.id]


def test_job_async_status_finished(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = queue.enqueue(fixtures.say_hello)
    assert job.result == "Hi there, Stranger!"
    assert job.get_status() == rqx.JobStatus.FINISHED


def test_enqueue_job_async_status_finished(rqx: Side) -> None:
    queue = rqx.Queue(is_async=False)
    job = rqx.Job.create(func=fixtures.say_hello, connection=rqx.connection)
    job = queue.enqueue_job(job)
    assert job.result == "Hi there, Stranger!"
    assert job.get_status() == rqx.JobStatus.FINISHED


def test_ttl_via_enqueue(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, ttl=1)
    assert job.get_ttl() == 1


def test_job_get_position(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    job2 = queue.enqueue(fixtures.say_hello)
    job3 = rqx.Job(uuid4().hex, connection=rqx.connection)
    assert job.get_position() == 0
    assert job2.get_position() == 1
    assert job3.get_position() is None


def test_job_delete_removes_itself_from_registries(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.div_by_zero)
    rqx.work(queue)
    registry = queue.failed_job_registry
    assert job in registry
    job.delete()
    assert job not in registry
    assert not rqx.Job.exists(job.id, connection=rqx.connection)

    job = queue.enqueue(fixtures.say_hello)
    rqx.work(queue)
    registry = queue.finished_job_registry
    assert job in registry
    job.delete()
    assert job not in registry


def test_create_job_with_id(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, job_id="1234")
    assert job.id == "1234"
    assert job.perform() == "Hi there, Stranger!"
    with pytest.raises(TypeError):
        queue.enqueue(fixtures.say_hello, job_id=1234)


@pytest.mark.parametrize(
    "bad", ["1234:4321", "bad id", "bad\\id", 'bad"id', "bad'id", "bad;id", "bad\nid", ""]
)
def test_create_job_with_invalid_id(rqx: Side, bad: str) -> None:
    queue = rqx.Queue()
    with pytest.raises(ValueError):
        queue.enqueue(fixtures.say_hello, job_id=bad)


def test_create_job_with_async(rqx: Side) -> None:
    queue = rqx.Queue()
    async_job = queue.enqueue(fixtures.say_hello_async, job_id="async_job")
    sync_job = queue.enqueue(fixtures.say_hello, job_id="sync_job")
    assert async_job.id == "async_job" and sync_job.id == "sync_job"
    assert async_job.perform() == sync_job.perform()


def test_create_job_from_static_method(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.ClassWithAStaticMethod.static_method)
    assert job.get_call_string() is not None
    assert job.perform() == "I'm a static method"


def test_create_job_with_ttl_should_have_ttl_after_enqueued(rqx: Side) -> None:
    queue = rqx.Queue()
    queue.enqueue(fixtures.say_hello, job_id="1234", ttl=10)
    job = queue.get_jobs()[0]
    assert job.ttl == 10


def test_create_job_with_ttl_should_expire(rqx: Side) -> None:
    queue = rqx.Queue()
    queue.enqueue(fixtures.say_hello, job_id="1234", ttl=1)
    time.sleep(1.1)
    assert len(queue.get_jobs()) == 0


def test_create_and_cancel_job(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello)
    assert len(queue.get_jobs()) == 1
    rqx.cancel_job(job.id, connection=rqx.connection)
    assert len(queue.get_jobs()) == 0
    registry = rqx.registry.CanceledJobRegistry(connection=rqx.connection, queue=queue)
    assert job in registry
    assert job.get_status() == rqx.JobStatus.CANCELED
    job.delete()
    assert job not in registry


def test_create_and_cancel_job_fails_already_canceled(rqx: Side) -> None:
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.say_hello, job_id="fake_job_id")
    assert len(queue.get_jobs()) == 1
    rqx.cancel_job(job.id, connection=rqx.connection)
    assert len(queue.get_jobs()) == 0
    registry = rqx.registry.CanceledJobRegistry(connection=rqx.connection, queue=queue)
    assert job in registry
    assert job.get_status() == rqx.JobStatus.CANCELED
    with pytest.raises(
        rqx.exceptions.InvalidJobOperation, match="Cannot cancel already canceled job: fake_job_id"
    ):
        rqx.cancel_job(job.id, connection=rqx.connection)


def test_blocking_result_fetch(rqx: Side) -> None:
    q = rqx.Queue("test_blocking_queue")
    job = q.enqueue(fixtures.long_running_job, 2)
    started_at = time.time()
    worker = rqx.work_in_background(q)
    result = job.latest_result(timeout=20)
    blocked_for = time.time() - started_at
    worker.join(30)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert result is not None
    assert blocked_for >= 2
    assert blocked_for < 20


def test_job_decorator_delay(rqx: Side) -> None:
    """rq's tests/test_decorator.py pattern (``@job(queue).delay``), as test_job relies on it."""
    q = rqx.Queue()

    @rqx.job(q, connection=rqx.connection)  # type: ignore[untyped-decorator]  # rq's job decorator is unannotated
    def hello(name: str) -> str:
        return name

    wrapped = rqx.job(q, connection=rqx.connection)(fixtures.say_hello)
    job = wrapped.delay("Ann")
    assert job.get_status() == rqx.JobStatus.QUEUED
    rqx.work(q)
    assert job.return_value() == "Hi there, Ann!"
    assert hello("direct") == "direct"


def test_job_decorator_enqueue(rqx: Side) -> None:
    """rq 3's name for ``.delay``: ``@job(queue)`` adds ``.enqueue`` (rq's test_decorator)."""
    q = rqx.Queue()
    wrapped = rqx.job(q, connection=rqx.connection)(fixtures.say_hello)
    job = wrapped.enqueue("Bo")
    rqx.work(q)
    assert job.return_value() == "Hi there, Bo!"


def test_save_inside_a_job_keeps_its_meta(rqx: Side) -> None:
    """rq code saves its running job with ``save()`` as often as with ``save_meta()``."""
    queue = rqx.Queue()
    job = queue.enqueue(fixtures.modify_self_and_save, {"progress": 1})
    rqx.work(queue)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.get_status() == rqx.JobStatus.FINISHED
    assert job.meta["progress"] == 1
    assert job.return_value() == "saved"


def test_func_and_instance(rqx: Side) -> None:
    """rq's tests/test_job.py: a fetched job's ``func`` is the function, ``instance`` None."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.some_calculation, 3, 4, z=2)
    job = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert job.func is fixtures.some_calculation
    assert job.instance is None
    assert job.func(*job.args, **job.kwargs) == fixtures.some_calculation(3, 4, z=2)


def test_get_status_of_a_deleted_job(rqx: Side) -> None:
    """rq's tests/test_job.py (test_get_status_fails_when_job_deleted_from_redis): a deleted
    job's status cannot be read: InvalidJobOperation; fetching it: NoSuchJobError."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    job_id = job.id
    job.delete()
    with pytest.raises(rqx.exceptions.InvalidJobOperation):
        job.get_status(refresh=True)
    with pytest.raises(rqx.exceptions.NoSuchJobError):
        rqx.Job.fetch(job_id, connection=rqx.connection)
