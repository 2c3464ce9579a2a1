"""What runfleet refuses where rq would go on: each refusal is loud, at the call, and
names what to change (a difference rq code cannot trip over silently). rq accepts
every call here, so this runs on runfleet only (``rf``); docs/how-to/moving-from-rq.md lists each
with its one-line change.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from runfleet.store.errors import InvalidInput
from tests.rq_parity import rq_fixtures as fixtures
from tests.rq_parity.conftest import Side


def test_arguments_the_function_cannot_take_are_refused_at_enqueue(rf: Side) -> None:
    q = rf.Queue()
    with pytest.raises(InvalidInput) as refused:  # rq lets the job fail when it runs
        q.enqueue(fixtures.say_hello, "Nick", foo="bar")
    assert refused.value.field == "payload" and "say_hello" in refused.value.problem
    assert isinstance(refused.value, ValueError)
    assert q.count == 0 and q.job_ids == [], "nothing was stored"


def test_rq_options_without_a_runfleet_meaning_are_refused_by_name(rf: Side) -> None:
    q = rf.Queue()
    for option in ("pipeline", "repeat", "rate_limit", "webhooks"):
        with pytest.raises(InvalidInput) as refused:
            q.enqueue(fixtures.say_hello, **{option: object()})
        assert refused.value.field == option
        assert "docs/how-to/moving-from-rq.md" in str(refused.value)
    for option in ("job_class", "serializer"):
        with pytest.raises(InvalidInput) as refused:
            rf.Queue(**{option: object()})
        assert refused.value.field == option
    assert q.count == 0
    job = q.enqueue(fixtures.say_hello)
    pipe = object()
    calls: list[Callable[[], object]] = [
        lambda: job.cancel(pipeline=pipe),
        lambda: job.delete(pipeline=pipe),
        lambda: job.save(pipeline=pipe),
        lambda: q.remove(job, pipeline=pipe),
    ]
    for call in calls:
        with pytest.raises(InvalidInput) as refused:
            call()
        assert refused.value.field == "pipeline"
    assert q.job_ids == [job.id], "a refused call changed nothing"
