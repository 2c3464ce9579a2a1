"""Throwaway servers: start, answer, die like a crash, and come back on the same port."""

from __future__ import annotations

import psycopg
import pytest
import redis

from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis

pytestmark = pytest.mark.chaos


def test_postgres_survives_kill_and_restart_on_the_same_port() -> None:
    with ThrowawayPostgres(durable_commits=True) as server:
        port = server.port
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (1)")

        server.kill()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url, connect_timeout=2)

        server.restart()
        assert server.port == port
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]

        server.restart()  # graceful this time, from a running server
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1,)


def test_redis_restarts_empty_on_the_same_port() -> None:
    with ThrowawayRedis() as server:
        port = server.port
        client = redis.Redis.from_url(server.url, socket_connect_timeout=1)
        try:
            client.set("k", "v")

            server.kill()
            with pytest.raises(redis.ConnectionError):
                client.ping()

            server.restart()
            assert server.port == port
            assert client.ping()
            assert client.get("k") is None  # no persistence: a restart loses everything
        finally:
            client.close()


def test_stop_is_harmless_before_start_and_twice() -> None:
    postgres, cache = ThrowawayPostgres(), ThrowawayRedis()
    postgres.stop()
    cache.stop()
    cache.start()
    cache.stop()
    cache.stop()
    assert not cache.running
