"""``retrying``: a plain first call, then tenacity's backoff for transient errors only."""

from __future__ import annotations

import time

import psycopg
import pytest

from runfleet.store.transient import retrying


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


async def test_a_call_that_succeeds_is_called_once_and_reports_nothing() -> None:
    seen: list[int] = []
    fn = Flaky([])
    assert await retrying(fn, give_up_after=5, on_retry=lambda n, _e: seen.append(n)) == "ok"
    assert fn.calls == 1 and seen == []


async def test_transient_errors_are_retried_and_each_is_reported_in_order() -> None:
    seen: list[tuple[int, str]] = []
    fn = Flaky([psycopg.OperationalError("gone"), ConnectionError("reset"), TimeoutError()])
    result = await retrying(
        fn, give_up_after=10, on_retry=lambda n, e: seen.append((n, type(e).__name__))
    )
    assert result == "ok" and fn.calls == 4
    assert seen == [(1, "OperationalError"), (2, "ConnectionError"), (3, "TimeoutError")]


async def test_a_permanent_error_is_raised_at_once() -> None:
    fn = Flaky([psycopg.errors.UniqueViolation("dup")])
    with pytest.raises(psycopg.errors.UniqueViolation):
        await retrying(fn, give_up_after=10)
    assert fn.calls == 1


async def test_a_permanent_error_after_transient_ones_is_raised_as_it_is() -> None:
    fn = Flaky([ConnectionError("reset"), ValueError("bad")])
    with pytest.raises(ValueError):
        await retrying(fn, give_up_after=10)
    assert fn.calls == 2


async def test_the_last_transient_error_is_raised_once_the_budget_is_spent() -> None:
    fn = Flaky([ConnectionError(str(i)) for i in range(1000)])
    began = time.monotonic()
    with pytest.raises(ConnectionError):
        await retrying(fn, give_up_after=0.5, max_wait=0.05)
    assert 0.4 <= time.monotonic() - began < 3
    assert 2 < fn.calls < 1000


async def test_no_budget_means_one_call() -> None:
    fn = Flaky([ConnectionError("reset")])
    with pytest.raises(ConnectionError):
        await retrying(fn, give_up_after=0)
    assert fn.calls == 1


async def test_check_runs_before_every_attempt_and_stops_the_retrying() -> None:
    fn = Flaky([ConnectionError("a"), ConnectionError("b"), ConnectionError("c")])
    checks = 0

    def check() -> None:
        nonlocal checks
        checks += 1
        if checks == 3:
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        await retrying(fn, give_up_after=10, check=check)
    assert fn.calls == 2 and checks == 3
