"""Where rq's reads come from on runfleet, which rq's own tests cannot show.

The registries are reads of the run rows in Postgres, with no second list: a producer whose
Redis answers nothing reads every registry exactly as one whose Redis works. A
``Queue(is_async=False)`` job runs in the caller and is not durable: nothing is stored, so
no read finds it afterwards. rq stores both in Redis, so these run on runfleet only
(``rf``: the ``rqx`` runfleet side).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side

REGISTRIES = (
    "started_job_registry",
    "finished_job_registry",
    "failed_job_registry",
    "deferred_job_registry",
    "scheduled_job_registry",
    "canceled_job_registry",
)


def test_every_registry_reads_postgres_alone(rf: Side, settings: Settings) -> None:
    q = rf.Queue()
    finished = q.enqueue(fixtures.say_hello)
    failed = q.enqueue(fixtures.div_by_zero)
    scheduled = q.enqueue_in(timedelta(hours=1), fixtures.say_hello)
    deferred = q.enqueue(fixtures.say_hello, depends_on=scheduled)
    canceled = q.enqueue(fixtures.say_hello)
    canceled.cancel()
    rf.work(q)
    expected = {
        "started_job_registry": [],
        "finished_job_registry": [finished.id],
        "failed_job_registry": [failed.id],
        "deferred_job_registry": [deferred.id],
        "scheduled_job_registry": [scheduled.id],
        "canceled_job_registry": [canceled.id],
    }
    assert {name: getattr(q, name).get_job_ids() for name in REGISTRIES} == expected
    # Nothing listens on port 1: every Redis call of this producer would fail.
    blind = rf.Queue(
        "default",
        connection=None,
        settings=settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}),
    )
    assert {name: getattr(blind, name).get_job_ids() for name in REGISTRIES} == expected
    assert blind.failed_job_registry.count == 1 and failed.id in blind.failed_job_registry
    assert blind.job_ids == [] and blind.fetch_job(finished.id) is not None


async def test_an_is_async_false_job_runs_here_and_is_not_stored(rf: Side, store: Store) -> None:
    q = rf.Queue(is_async=False)
    done = q.enqueue(fixtures.say_hello, "inline", job_id="inline-done")
    broken = q.enqueue(fixtures.div_by_zero, job_id="inline-failed")
    assert done.get_status() == rf.JobStatus.FINISHED and done.return_value() == "Hi there, inline!"
    assert broken.get_status() == rf.JobStatus.FAILED
    assert broken.exc_info is not None and "ZeroDivisionError" in broken.exc_info
    for job_id in ("inline-done", "inline-failed"):
        assert await store.runs.get(job_id) is None, "an inline job writes no run row"
        assert not rf.Job.exists(job_id, connection=rf.connection)
        with pytest.raises(rf.exceptions.NoSuchJobError):
            rf.Job.fetch(job_id, connection=rf.connection)
    durable = rf.Queue()
    assert durable.failed_job_registry.get_job_ids() == []
    assert durable.finished_job_registry.get_job_ids() == []
