"""Admission options are fields (``AdmissionOptions``); the run state they write is the
JSON every version wrote, key for key."""

from __future__ import annotations

from typing import Any

from runfleet.producer.admission import rq_options
from runfleet.store.types import (
    AdmissionOptions,
    Forked,
    Origin,
    Requeued,
    Resumed,
    RqOptions,
    RqRetry,
    Tick,
)


class Retry:
    """rq's ``Retry``: what ``rq_options`` reads of it."""

    def __init__(self, max: int, intervals: list[Any]) -> None:
        self.max, self.intervals = max, intervals


def done(job: Any, connection: Any, result: Any) -> None:
    """A callback a worker can import by name."""


def test_rq_options_write_the_keys_rq_jobs_always_had() -> None:
    rq = rq_options(
        ttl="10m",
        result_ttl=60,
        failure_ttl="1h",
        job_timeout=2.5,
        retry=Retry(3, [1, 2]),
        on_success=done,
        meta={"k": [1]},
        description=7,  # type: ignore[arg-type]  # rq stores str() of what it is given
        allow_failure=True,
    )
    assert rq.timeout_ms == 2500
    assert rq.options.state() == {
        "ttl": 600,
        "allow_failure": True,
        "meta": {"k": [1]},
        "description": "7",
        "result_ttl": 60,
        "failure_ttl": 3600,
        "retry": {"max": 3, "intervals": [1.0, 2.0]},
        "callbacks": {"on_success": f"{__name__}:done"},
        "job_timeout": 2.5,
    }
    assert rq_options().options.state() == {}, "no option, no key"
    assert rq_options(job_timeout=30).options.state() == {"job_timeout": 30}


def test_every_field_has_its_stored_key() -> None:
    options = AdmissionOptions(
        rq=RqOptions(at_front=True, dependency_ids=("a", "b"), depends_on=("b",)),
        flow_version="v2",
        flow_instance="acme",
        trace={"traceparent": "00-x-y-01"},
    )
    assert options.state() == {
        "at_front": True,
        "dependency_ids": ["a", "b"],
        "depends_on": ["b"],
        "flow_version": "v2",
        "flow_instance": "acme",
        "trace": {"traceparent": "00-x-y-01"},
    }
    origins: dict[Origin, dict[str, Any]] = {
        Requeued("r", None): {"requeued_from": "r", "requeued_by": None},
        Forked("r", 2): {"forked_from": "r", "replays": 2},
        Resumed("r", 0): {"resumed_from": "r", "replays": 0},
        Tick("nightly", 5, False): {"schedule": "nightly", "tick_ms": 5, "late": False},
    }
    for origin, state in origins.items():
        assert AdmissionOptions(origin=origin).state() == state


def test_a_stored_state_reads_back_its_options_and_skips_what_is_not_one() -> None:
    written = AdmissionOptions(
        rq=RqOptions(
            meta={"k": 1},
            description="d",
            retry=RqRetry(2, (1.0,)),
            callbacks={"on_failure": "m:f"},
            callback_timeouts={"on_failure": 5},
            result_ttl=9,
            depends_on=("x",),
        ),
        flow_version="v1",
        flow_instance="acme",
    )
    assert AdmissionOptions.from_state(written.state()) == written
    hostile = {
        "meta": [1],
        "description": 5,
        "retry": {"max": "3", "intervals": []},
        "callbacks": {"on_success": 1},
        "result_ttl": True,
        "depends_on": "x",
        "flow_version": 2,
    }
    assert AdmissionOptions.from_state(hostile) == AdmissionOptions()
