"""rq's deprecated ``job.result`` property is runfleet's ``result(timeout)`` method: rq code
that reads it as a value must fail loudly, never go on with a bound method.

Runs on both sides: on rq the same expressions read the value (the control), on runfleet
each raises ``TypeError`` naming ``return_value()``; calling it is runfleet's wait.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side

AS_A_VALUE: dict[str, Callable[[Any], object]] = {
    "truth": lambda job: bool(job.result),
    "==": lambda job: job.result == "Hi there, Stranger!",
    "!=": lambda job: job.result != "Hi there, Stranger!",
    "str": lambda job: str(job.result),
    "format": lambda job: f"{job.result}",
    "hash": lambda job: hash(job.result),
}


@pytest.mark.parametrize("use", sorted(AS_A_VALUE))
def test_job_result_used_as_a_value(rqx: Side, use: str) -> None:
    q = rqx.Queue()
    job = q.enqueue(fixtures.say_hello)
    rqx.work(q)
    if rqx.name == "rq":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # rq's own deprecation
            AS_A_VALUE[use](job)
            assert job.result == "Hi there, Stranger!"
        return
    with pytest.raises(TypeError, match=r"return_value\(\)"):
        AS_A_VALUE[use](job)
    assert job.result(timeout=10) == job.return_value() == "Hi there, Stranger!"
    assert "return_value()" in repr(job.result)
