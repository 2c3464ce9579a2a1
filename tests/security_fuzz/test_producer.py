"""The producer API under hostile input: success or a typed error, never a raw
exception, a hang or a traceback."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tests.trust.flows as tf
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, RunfleetError
from tests.security_fuzz.strategies import (
    DEEP,
    LONE_SURROGATE,
    NUL,
    anything,
    odd_numbers,
    odd_text,
)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
async def q(settings: Settings) -> AsyncIterator[AsyncQueue]:
    fast = settings.model_copy(update={"producer_retry_for": 0.5})
    async with AsyncQueue("default", settings=fast) as queue:
        yield queue


async def _settles(call: Awaitable[Any]) -> BaseException | None:
    """Run ``call`` with a hang bound; the exception it raised, or None on success."""
    try:
        await asyncio.wait_for(call, 10)
    except TimeoutError as exc:  # a hang is never acceptable; TimeoutError from result() is
        return exc
    except BaseException as exc:
        return exc
    return None


def _judge(exc: BaseException | None, *fields: str) -> None:
    if exc is None:
        return
    assert isinstance(exc, RunfleetError), f"raw {type(exc).__name__}: {exc!r}"
    if isinstance(exc, InvalidInput) and fields:
        assert exc.field in fields, f"{exc.field!r} is not one of {fields}: {exc}"


@FUZZ
@given(args=st.lists(anything, max_size=3), kwargs=st.dictionaries(odd_text, anything, max_size=2))
@example(args=[LONE_SURROGATE], kwargs={})
@example(args=[f"a{NUL}b"], kwargs={})
@example(args=[math.nan], kwargs={})
@example(args=[2**70], kwargs={})
@example(args=[], kwargs={LONE_SURROGATE: 1})
@example(args=[], kwargs={"f": 1})  # enqueue's own parameter name, as a keyword of the call
@example(args=[], kwargs={"kwargs": 1})  # rq's explicit kwargs=, not a mapping
@example(args=[], kwargs={"args": 1})  # rq's explicit args=, not a list
async def test_enqueue_payloads(q: AsyncQueue, args: list[Any], kwargs: dict[str, Any]) -> None:
    exc = await _settles(q.enqueue(tf.leaf, *args, **kwargs))
    _judge(exc, "payload", "args", "kwargs")


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [(1, None, "args"), ("ab", None, "args"), (None, 1, "kwargs"), (None, [("a", 1)], "kwargs")],
)
async def test_explicit_call_arguments_of_the_wrong_shape_are_named(
    q: AsyncQueue, args: Any, kwargs: Any, field: str
) -> None:
    """rq's ``args=``/``kwargs=`` through each entry point that takes them: a typed error
    naming the argument, before anything is written."""
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: q.enqueue(tf.leaf, args=args, kwargs=kwargs),
        lambda: q.enqueue_call(tf.leaf, args, kwargs),
        lambda: q.enqueue_many([AsyncQueue.prepare_data(tf.leaf, args, kwargs)]),
    ]
    before = await q.queued_ids()
    for call in calls:
        with pytest.raises(InvalidInput) as caught:
            await call()
        assert caught.value.field == field
    assert await q.queued_ids() == before


@FUZZ
@given(run_id=st.one_of(odd_text, st.integers(), st.binary(max_size=4)))
async def test_enqueue_run_ids(q: AsyncQueue, run_id: Any) -> None:
    exc = await _settles(q.enqueue(tf.leaf, 1, run_id=run_id))
    _judge(exc, "run_id")


@FUZZ
@given(name=st.one_of(odd_text, st.integers()))
async def test_enqueue_flow_names(q: AsyncQueue, name: Any) -> None:
    exc = await _settles(q.enqueue(name, 1))
    _judge(exc, "flow")


@FUZZ
@given(seconds=odd_numbers)
@example(seconds=1e300)
@example(seconds=math.nan)
async def test_enqueue_in_and_at(q: AsyncQueue, seconds: Any) -> None:
    try:
        delay = timedelta(seconds=seconds)
    except (OverflowError, ValueError, TypeError):
        delay = None  # Python itself refuses: nothing of ours to judge here
    if delay is not None:
        _judge(await _settles(q.enqueue_in(delay, tf.leaf, 1)), "delay", "when")
    _judge(await _settles(q.enqueue_at(datetime.max.replace(tzinfo=UTC), tf.leaf, 1)), "when")
    _judge(await _settles(q.enqueue_at(datetime.min, tf.leaf, 1)), "when")


@FUZZ
@given(timeout=st.one_of(odd_numbers, odd_text, st.none()))
@example(timeout=math.nan)
@example(timeout=math.inf)
@example(timeout=-1)
async def test_result_timeouts_never_hang(q: AsyncQueue, timeout: Any) -> None:
    if isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 1:
        timeout = 0.2  # a long finite wait is legitimate: it waits, as asked
    run = await q.enqueue(tf.waiter)  # never answered: result() can only time out
    started = asyncio.get_running_loop().time()
    exc = await _settles(run.result(timeout=timeout))
    assert asyncio.get_running_loop().time() - started < 9, "result() must not hang"
    if isinstance(exc, TimeoutError):
        return  # the documented outcome of a wait that ran out
    _judge(exc, "timeout")


async def test_deep_nesting_anywhere_is_refused_not_a_recursion_error(q: AsyncQueue) -> None:
    for call in (
        lambda: q.enqueue(tf.leaf, DEEP),
        lambda: q.enqueue(tf.leaf, 1, run_id=DEEP),
        lambda: q.enqueue(DEEP, 1),
        lambda: q.complete("r", "go", DEEP),
        lambda: q.complete("r", DEEP),
    ):
        exc = await _settles(call())
        assert isinstance(exc, RunfleetError), type(exc).__name__


@FUZZ
@given(option=st.sampled_from(["job_timeout", "result_ttl", "failure_ttl"]), value=odd_numbers)
async def test_rq_option_numbers(q: AsyncQueue, option: str, value: Any) -> None:
    exc = await _settles(q.enqueue(tf.leaf, 1, **{option: value}))
    _judge(exc, option)


@FUZZ
@given(scopes=st.one_of(odd_text, st.lists(anything, max_size=3), st.integers(), st.none()))
@example(scopes="abc")
def test_scopes(settings: Settings, scopes: Any) -> None:
    try:
        made = AsyncQueue("default", settings=settings, scopes=scopes)
    except BaseException as exc:
        _judge(exc, "scopes")
        return
    assert all((isinstance(s, str) and len(s) > 1) or s for s in made.scopes)
    assert not isinstance(scopes, str)


@FUZZ
@given(run_id=odd_text, name=st.one_of(odd_text, st.integers()), value=anything)
async def test_answers(q: AsyncQueue, run_id: str, name: Any, value: Any) -> None:
    _judge(await _settles(q.complete(run_id, name, value)), "run_id", "deferred name", "value")
    exc = await _settles(q.approve(run_id, name, value, actor="fuzz"))
    _judge(exc, "run_id", "token", "value", "actor")
    _judge(await _settles(q.cancel(run_id)), "run_id")
