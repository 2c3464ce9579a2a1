"""The one classification: which errors are infrastructure (retry) and which are the
caller's (surface). Real server errors where a server can produce them cheaply."""

from __future__ import annotations

import asyncio

import psycopg
import psycopg.errors as pg
import psycopg_pool
import pytest
import redis.exceptions as rx

from runfleet.store.errors import InvalidInput, Unavailable
from runfleet.store.transient import TRANSIENT_TYPES, is_transient, service_of
from runfleet.worker.retry import INFRA_ERRORS, with_retry


@pytest.mark.parametrize(
    "exc",
    [
        pg.AdminShutdown("terminating connection due to administrator command"),
        pg.CrashShutdown("terminating connection because of crash of another server process"),
        pg.CannotConnectNow("the database system is starting up"),
        pg.SerializationFailure("could not serialize access"),
        pg.DeadlockDetected("deadlock detected"),
        pg.LockNotAvailable("could not obtain lock"),
        pg.ProtocolViolation("server conn crashed?"),  # PgBouncer: 08P01
        pg.ProtocolViolation("query_wait_timeout"),
        pg.TooManyConnections("sorry, too many clients already"),
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.InterfaceError("the connection is closed"),
        psycopg.InternalError("received 2 results from command 'COMMIT'"),
        pg.InvalidSqlStatementName('prepared statement "_pg3_7" does not exist'),
        pg.DuplicatePreparedStatement('prepared statement "_pg3_1" already exists'),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
        rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379"),
        rx.TimeoutError("Timeout reading from socket"),
        rx.BusyLoadingError("Redis is loading the dataset in memory"),
        rx.ReadOnlyError("You can't write against a read only replica."),
        rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        rx.TryAgainError("Multiple keys request during rehashing of slot"),
        rx.ClusterDownError("The cluster is down"),
        rx.MasterDownError("Link with MASTER is down"),
        rx.ResponseError("BUSY Redis is busy running a script"),
        ConnectionResetError("reset by peer"),
        TimeoutError(),
    ],
    ids=repr,
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)
    assert isinstance(exc, TRANSIENT_TYPES) or isinstance(exc, rx.ResponseError)
    assert INFRA_ERRORS is TRANSIENT_TYPES


@pytest.mark.parametrize(
    "exc",
    [
        pg.UniqueViolation("duplicate key"),
        pg.CheckViolation("new row violates check constraint"),
        pg.UndefinedTable("relation does not exist"),
        pg.InvalidSqlStatementName('prepared statement "mine" does not exist'),
        pg.ProgramLimitExceeded("index row size exceeds maximum"),
        psycopg.DataError("invalid input syntax"),
        psycopg_pool.PoolClosed("the pool is closed"),
        rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rx.ResponseError("NOGROUP No such key or consumer group"),
        rx.AuthenticationError("invalid username-password pair"),
        InvalidInput("run_id", "empty"),
        Unavailable("postgres", psycopg.OperationalError("down")),
        ValueError("user code"),
        KeyError("user code"),
        asyncio.CancelledError(),
    ],
    ids=repr,
)
def test_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_service_of() -> None:
    assert service_of(pg.AdminShutdown()) == "postgres"
    assert service_of(psycopg_pool.PoolTimeout()) == "postgres"
    assert service_of(rx.ReadOnlyError()) == "redis"
    assert service_of(ConnectionResetError()) == "network"


async def test_a_real_deadlock_is_retried_not_surfaced(database_url: str) -> None:
    """Two transactions locking two rows in opposite orders: Postgres aborts one with
    DeadlockDetected; ``with_retry`` runs the loser again and it succeeds."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as setup:
        await setup.execute("CREATE TABLE dl (id int PRIMARY KEY, v int)")
        await setup.execute("INSERT INTO dl VALUES (1, 0), (2, 0)")
    both_locked_first = asyncio.Barrier(2)
    attempts: list[str] = []

    async def swap(first: int, second: int, tag: str) -> str:
        attempts.append(tag)
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            async with conn.transaction():
                await conn.execute("UPDATE dl SET v = v + 1 WHERE id = %s", (first,))
                if attempts.count(tag) == 1:
                    await both_locked_first.wait()
                await conn.execute("UPDATE dl SET v = v + 1 WHERE id = %s", (second,))
        return tag

    done = await asyncio.gather(
        with_retry("test", lambda: swap(1, 2, "a")), with_retry("test", lambda: swap(2, 1, "b"))
    )
    assert list(done) == ["a", "b"]
    assert len(attempts) == 3, attempts  # the deadlock's loser ran twice
    async with await psycopg.AsyncConnection.connect(database_url) as check:
        rows = await (await check.execute("SELECT v FROM dl ORDER BY id")).fetchall()
    assert rows == [(2,), (2,)]
