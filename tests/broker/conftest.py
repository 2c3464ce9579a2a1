"""Broker fixtures over the real Redis of the session harness (``redis_url``, ``redis_prefix``).

Every test works under its own key prefix, so nothing here ever touches keys outside
it: the server may be shared with other sessions, which is also why the "group lost"
tests delete this prefix's keys instead of running FLUSHALL.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from runfleet.broker import hostile
from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.broker.notify import Notifier
from runfleet.broker.streams import Streams


def closed_port() -> int:
    """A loopback port nothing listens on (bound once by us, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(autouse=True)
def fresh_log_limits() -> None:
    """Each test sees its own first ``notify.malformed``-style line: the limiter is global."""
    hostile.rate_limited.reset()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def dead_redis() -> AsyncIterator[Redis]:
    """A client for a Redis that is not there: every command fails to connect."""
    client = connect(f"redis://127.0.0.1:{closed_port()}/0", connect_timeout=0.5)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def host_id() -> str:
    return f"host-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def streams(redis: Redis, redis_prefix: str) -> Streams:
    return Streams(redis, redis_prefix)


@pytest.fixture
def liveness(redis: Redis, redis_prefix: str, host_id: str) -> Liveness:
    return Liveness(redis, redis_prefix, host_id, heartbeat_interval=1.0)


@pytest.fixture
def notifier(redis: Redis, redis_prefix: str) -> Notifier:
    return Notifier(redis, redis_prefix)
