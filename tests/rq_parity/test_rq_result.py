"""``job.result`` read as rq reads it, and runfleet's waiting call beside it.

rq 3's ``job.result`` is a deprecated property: the return value of the latest successful
execution, None until there is one, with a ``DeprecationWarning`` naming ``return_value``
(``exc_info`` likewise, naming ``latest_result()``). The parity tests run on real rq (the
control) and on runfleet (``rqx``). runfleet waits with ``job.wait(timeout)``; the old
spelling ``job.result(timeout)`` still waits and warns naming ``job.wait`` (``rf``: runfleet
only, rq has no call that waits and answers the value).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import runfleet.rqface.jobs as rq_jobs
from runfleet.producer.run import RunFailed
from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side

HELLO = "Hi there, Stranger!"

READ = r"job\.result is deprecated, use job\.return_value instead"
"""rq 3's warning for reading ``job.result``, on both sides."""

CALLED = r"job\.result\(timeout\) is deprecated, use job\.wait\(timeout\)"
"""runfleet's warning for the old waiting spelling."""


def read_result(job: Any) -> Any:
    with pytest.warns(DeprecationWarning, match=READ):
        return job.result


@contextmanager
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


AS_A_VALUE: dict[str, Callable[[Any], object]] = {
    "is None": lambda value: value is None,
    "truth": bool,
    "==": lambda value: value == HELLO,
    "!=": lambda value: value != HELLO,
    "str": str,
    "format": lambda value: f"{value}",
    "hash": hash,
    "type": type,
}


# ---- parity: rq's property --------------------------------------------------------------


@pytest.mark.parametrize("use", sorted(AS_A_VALUE))
def test_result_is_the_value(rqx: Side, use: str) -> None:
    """Every use of the value is the value's: before the job ran (None) and after."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    assert AS_A_VALUE[use](read_result(job)) == AS_A_VALUE[use](None)
    rqx.work(q)
    assert AS_A_VALUE[use](read_result(job)) == AS_A_VALUE[use](HELLO)


def test_result_reads_warn_as_rq_warns(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.div_by_zero)
    rqx.work(q)
    with pytest.warns(DeprecationWarning, match=READ):
        assert job.result is None
    with pytest.warns(
        DeprecationWarning, match=r"job\.exc_info is deprecated, use job\.latest_result\(\) instead"
    ):
        assert "ZeroDivisionError" in (job.exc_info or "")
    with no_warnings():  # rq's own spellings do not warn
        assert job.return_value() is None
        assert "ZeroDivisionError" in job.latest_result().exc_string


def test_result_of_a_fetched_job(rqx: Side) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.some_calculation, 3, 4, z=2)
    fetched = rqx.Job.fetch(job.id, connection=rqx.connection)
    assert read_result(fetched) is None
    rqx.work(q)
    assert read_result(rqx.Job.fetch(job.id, connection=rqx.connection)) == 6
    assert read_result(fetched) == 6  # read again: not cached while there was none


def test_result_of_a_job_that_returned_none_failed_or_was_canceled(rqx: Side) -> None:
    q = rqx.Queue()
    nothing = q.enqueue(fixtures.do_nothing)
    failing = q.enqueue(fixtures.div_by_zero)
    canceled = q.enqueue(fixtures.say_hello)
    canceled.cancel()
    rqx.work(q)
    assert nothing.get_status() == rqx.JobStatus.FINISHED
    assert failing.get_status() == rqx.JobStatus.FAILED
    assert canceled.get_status() == rqx.JobStatus.CANCELED
    assert [read_result(j) for j in (nothing, failing, canceled)] == [None, None, None]


def test_create_typical_job_has_no_result(rqx: Side) -> None:
    """rq's test_job.py::test_create_typical_job, its reads of a job not yet enqueued that
    runfleet answers (the rest need the job's hash, which runfleet writes at enqueue)."""
    job = rqx.Job.create(
        func=fixtures.some_calculation, args=(3, 4), kwargs=dict(z=2), connection=rqx.connection
    )
    assert job.id is not None
    assert read_result(job) is None


def test_result_across_a_requeue(rqx: Side) -> None:
    """A failed job reads None; requeued and finished, a fresh read answers the value."""
    q = rqx.Queue()
    job = q.enqueue(fixtures.fail_once, "result-requeue")
    rqx.work(q)
    assert read_result(rqx.Job.fetch(job.id, connection=rqx.connection)) is None
    q.failed_job_registry.requeue(job.id)
    rqx.work(q)
    assert read_result(rqx.Job.fetch(job.id, connection=rqx.connection)) == "second time"


# ---- runfleet: the waiting call and its old spelling -------------------------------------


def test_wait_waits_for_the_value(rf: Side) -> None:
    q = rf.Queue()
    job = q.enqueue(fixtures.say_hello)
    worker = rf.work_in_background(q)
    with no_warnings():
        assert job.wait(timeout=30) == HELLO
        assert job.wait(30) == HELLO
    worker.join(60)
    failing = q.enqueue(fixtures.div_by_zero)
    rf.work(q)
    with no_warnings(), pytest.raises(ZeroDivisionError) as raised:
        failing.wait(10)
    assert isinstance(raised.value, RunFailed)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda job: job.result(timeout=30), id="timeout="),
        pytest.param(lambda job: job.result(30), id="positional"),
        pytest.param(lambda job: job.result(), id="no-argument"),
    ],
)
def test_result_called_still_waits_and_warns(rf: Side, call: Callable[[Any], Any]) -> None:
    """``job.result(timeout)``, runfleet's waiting call before ``wait``: it waits as before
    (started before the job ran), with a warning naming ``job.wait`` at the caller's line."""
    q = rf.Queue()
    job = q.enqueue(fixtures.say_hello)
    answer: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        waiting = threading.Thread(target=lambda: answer.append(call(job)))
        waiting.start()
        rf.work(q)
        waiting.join(60)
    assert answer == [HELLO]
    ours = [w for w in caught if "job.result" in str(w.message)]
    assert [(w.category, str(w.message)) for w in ours] == [
        (
            DeprecationWarning,
            "job.result(timeout) is deprecated, use job.wait(timeout): it waits the same way "
            "(job.result is rq's property now: the return value, or None)",
        )
    ]
    assert {w.filename for w in ours} == {__file__}


def test_result_called_raises_what_wait_raises(rf: Side) -> None:
    q = rf.Queue()
    job = q.enqueue(fixtures.div_by_zero)
    rf.work(q)
    with pytest.warns(DeprecationWarning, match=CALLED), pytest.raises(ZeroDivisionError):
        job.result(timeout=10)


def test_result_handed_on_uncalled_is_the_value(rf: Side) -> None:
    """Only the call at the attribute's own site waits: ``f = job.result`` is the value
    (hand ``job.wait`` on instead)."""
    q = rf.Queue()
    job = q.enqueue(fixtures.say_hello)
    handed = read_result(job)
    with pytest.raises(TypeError, match="not callable"):
        handed(30)
    assert handed is None
    rf.work(q)
    assert read_result(job) == HELLO
    hand_on = job.wait
    assert hand_on(10) == HELLO


def test_async_run_waits_under_both_names(rf: Side) -> None:
    """``AsyncRun.wait`` is the sync ``wait``'s twin; ``AsyncRun.result(timeout)`` is the same
    call (no rq property competes for the name there), without a warning."""
    q = rf.Queue()
    job = q.enqueue(fixtures.say_hello)
    rf.work(q)
    with no_warnings():
        assert q._now(lambda aq: aq.run(job.id).wait(10)) == HELLO
        assert q._now(lambda aq: aq.run(job.id).result(10)) == HELLO


def test_inline_job_result_and_wait(rf: Side) -> None:
    """``is_async=False``: the outcome is in memory; reads and ``wait`` answer from it."""
    q = rf.Queue(is_async=False)
    done = q.enqueue(fixtures.say_hello)
    failed = q.enqueue(fixtures.div_by_zero)
    assert read_result(done) == HELLO and read_result(failed) is None
    assert done.wait(1) == HELLO
    with pytest.raises(ZeroDivisionError):
        failed.wait(1)


def test_wait_on_an_open_job_reads_it_once_then_waits_for_its_notice(
    rf: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Job.wait`` of a job still queued reads its row once in the caller's thread (the
    round that answers for it) and waits on that; no ``refresh()`` of the whole job (its
    activation and dependencies) on the way."""
    q = rf.Queue()
    job = q.enqueue(fixtures.say_hello)

    def no_refresh(*args: object) -> None:
        raise AssertionError("wait() refreshed the job")

    monkeypatch.setattr(rq_jobs, "read_job", no_refresh)
    answered: list[object] = []
    waiter = threading.Thread(target=lambda: answered.append(job.wait(60)))
    waiter.start()
    rf.work(q)
    waiter.join(60)
    assert answered == [HELLO]
