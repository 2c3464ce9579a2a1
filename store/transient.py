"""One classification of errors: transient infrastructure trouble versus everything else.

A transient error says nothing about the request: the database or Redis was
restarting, failing over, overloaded, or a pooler lost its server connection, and the
same call made again later can succeed. Everything else (a caller's bad input, a
constraint, a bug) is permanent: retrying it only hides it. Store, broker and worker
all ask ``is_transient`` so that the line is drawn once, and ``retrying`` is the one
backoff loop they share (the worker adds logging and metrics around it; producers
turn a give-up into ``Unavailable``).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import psycopg.errors as pg
import psycopg_pool
import redis.exceptions as rx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from runfleet.store.errors import RunfleetError

T = TypeVar("T")

POSTGRES_TYPES: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,  # connection lost, admin/crash shutdown, 40xxx rollbacks, 57xxx
    psycopg.InterfaceError,  # a connection already found closed
    psycopg.InternalError,  # only psycopg's own, without SQLSTATE: a desynced connection
    psycopg_pool.PoolTimeout,
    psycopg_pool.TooManyRequests,
    pg.InvalidSqlStatementName,  # only a pooler's lost `_pg3_N` (see _pooler_prepared)
    pg.DuplicatePreparedStatement,
)
REDIS_TYPES: tuple[type[BaseException], ...] = (
    rx.ConnectionError,  # includes BusyLoadingError (LOADING)
    rx.TimeoutError,
    rx.ReadOnlyError,  # READONLY: a replica, or a failover in progress
    rx.OutOfMemoryError,  # OOM under noeviction: clears when memory is freed
    rx.TryAgainError,
    rx.ClusterDownError,
    rx.MasterDownError,
)
TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    *POSTGRES_TYPES,
    *REDIS_TYPES,
    ConnectionError,
    TimeoutError,
)
"""Every type that *may* be transient, for ``except`` clauses; ``is_transient`` decides.

A generic Redis ``ResponseError`` is not in it (WRONGTYPE and NOGROUP are answers
about the command); the few transient replies redis-py leaves generic (``BUSY``,
``MISCONF``) are still recognised by ``is_transient``."""

REDIS_TRANSIENT_REPLIES = frozenset(
    {"LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "BUSY", "OOM", "MISCONF"}
)
"""Redis error-reply codes that describe the server's state, not the command."""

_PERMANENT_SQLSTATE_CLASSES = ("54",)  # program limit exceeded: the same statement fails again
_PERMANENT_SQLSTATES = frozenset({"55000", "57P04"})  # wrong prerequisite state; database dropped
_PERMANENT_REDIS = (rx.AuthenticationError, rx.AuthorizationError, rx.NoPermissionError)


def is_transient(exc: BaseException) -> bool:
    """Whether the same call, made again once the service recovers, may well succeed."""
    if isinstance(exc, psycopg_pool.PoolClosed):
        return False  # closed on purpose by this process (an OperationalError subclass)
    if isinstance(exc, RunfleetError):
        return False  # an answer (a run that failed with a TimeoutError is a RunFailed too)
    if isinstance(exc, psycopg.Error):
        return _postgres_transient(exc)
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.TooManyRequests):
        return True
    if isinstance(exc, rx.RedisError):
        return _redis_transient(exc)
    return isinstance(exc, ConnectionError | TimeoutError)


def _postgres_transient(exc: psycopg.Error) -> bool:
    if isinstance(exc, pg.InvalidSqlStatementName | pg.DuplicatePreparedStatement):
        return _pooler_prepared(exc)
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.InternalError) and exc.sqlstate is None:
        return True  # psycopg lost the protocol's thread (a pooler's dying server connection)
    if not isinstance(exc, psycopg.OperationalError):
        return False  # data, integrity, programming errors: the request itself is wrong
    state = exc.sqlstate or ""
    return state[:2] not in _PERMANENT_SQLSTATE_CLASSES and state not in _PERMANENT_SQLSTATES


def _pooler_prepared(exc: psycopg.Error) -> bool:
    """psycopg's automatic prepared statements (``_pg3_N``) lost or doubled by a pooler.

    A transaction-mode pooler hands each transaction a different server
    connection, so a statement prepared on one is missing (or already there) on the
    next. Any other prepared-statement error is the caller's.
    """
    return "_pg3_" in str(exc)


def _redis_transient(exc: rx.RedisError) -> bool:
    if isinstance(exc, _PERMANENT_REDIS):
        return False
    if isinstance(exc, REDIS_TYPES):
        return True
    if isinstance(exc, rx.ResponseError):
        code = str(exc).split(" ", 1)[0].upper()
        return code in REDIS_TRANSIENT_REPLIES
    return False


def service_of(exc: BaseException) -> str:
    """Which service an error came from, for messages: ``postgres``, ``redis`` or ``network``."""
    if isinstance(exc, psycopg.Error | psycopg_pool.PoolTimeout | psycopg_pool.TooManyRequests):
        return "postgres"
    if isinstance(exc, rx.RedisError):
        return "redis"
    return "network"


_blocking = contextvars.ContextVar("runfleet_blocking_caller", default=False)
"""Whether the coroutine runs in a blocking caller's own thread (``store.inline.drive``),
where there is no event loop to sleep on."""


def blocking_caller() -> contextvars.Token[bool]:
    """Mark the current context as a blocking caller's: ``pause`` sleeps its thread.
    Returns the token to ``reset`` it with."""
    return _blocking.set(True)


def end_blocking_caller(token: contextvars.Token[bool]) -> None:
    _blocking.reset(token)


async def pause(seconds: float) -> None:
    """Wait ``seconds`` between retries: on the event loop, or, for a blocking caller
    (a sync ``Queue`` call driven in its own thread), in that thread, as any blocking
    client waits; the same backoff either way."""
    if _blocking.get():
        time.sleep(seconds)  # noqa: ASYNC251 - a blocking caller's own thread, no loop
    else:
        await asyncio.sleep(seconds)


async def retrying(
    fn: Callable[[], Awaitable[T]],
    *,
    give_up_after: float,
    check: Callable[[], None] | None = None,
    on_retry: Callable[[int, BaseException], None] | None = None,
    max_wait: float = 1.0,
) -> T:
    """Call ``fn`` until it returns, retrying transient errors with jittered backoff.

    ``check`` runs before every attempt (no I/O): it raises to stop, so a flow whose
    lease lapsed starts no write and stops retrying rather than keep knocking. After
    ``give_up_after`` seconds the last transient error is raised as it was; any other
    error at once.

    The first attempt is a plain call: tenacity's machinery (tens of microseconds, on
    every store call of the hot path) is set up only once a transient error happened.
    """
    started = time.monotonic()
    if check is not None:
        check()
    try:
        return await fn()
    except Exception as exc:
        if not is_transient(exc):
            raise
        first = exc

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if on_retry is not None and exc is not None:
            on_retry(state.attempt_number + 1, exc)  # the plain call was attempt 1

    remaining = give_up_after - (time.monotonic() - started)
    if remaining <= 0:
        raise first
    if on_retry is not None:
        on_retry(1, first)
    retryer = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=wait_exponential_jitter(multiplier=0.05, max=max_wait, jitter=0.1),
        stop=stop_after_delay(remaining),
        before_sleep=before_sleep,
        reraise=True,
        sleep=pause,
    )
    # The backoff the plain call earned, as tenacity would have slept it.
    await pause(min(remaining, retryer.wait(RetryCallState(retryer, None, (), {}))))
    async for attempt in retryer:
        if check is not None:
            check()
        with attempt:
            return await fn()
    raise AssertionError("unreachable")  # pragma: no cover
