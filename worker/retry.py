"""Retrying infrastructure failures (database or Redis unreachable) with backoff.

Retries are for the network and the servers, never for a lost race: those are
outcomes. Every retry is logged and counted so an outage is visible, not silent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import psycopg_pool
import redis.exceptions
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from worker import metrics

log = logging.getLogger("runfleet.worker.retry")
T = TypeVar("T")

INFRA_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg_pool.PoolTimeout,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
    TimeoutError,
)


def _log_retry(component: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        metrics.INFRA_ERRORS.labels(component).inc()
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "infra.retry",
            extra={"component": component, "attempt": state.attempt_number, "error": repr(exc)},
        )

    return before_sleep


async def with_retry(
    component: str, fn: Callable[[], Awaitable[T]], *, give_up_after: float = 60.0
) -> T:
    """Call ``fn`` until it succeeds, retrying infrastructure errors with jittered backoff."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(INFRA_ERRORS),
        wait=wait_exponential_jitter(multiplier=0.1, max=2.0),
        stop=stop_after_delay(give_up_after),
        before_sleep=_log_retry(component),
        reraise=True,
    ):
        with attempt:
            return await fn()
    raise AssertionError("unreachable")  # pragma: no cover
