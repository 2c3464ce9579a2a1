"""A sync enqueue's wake is written and not waited for (``broker.blocking.UnansweredXadds``).

Against the real Redis: the wake is on its stream when ``enqueue`` returns although its
reply was never read; replies are read later and never pile up; an error reply is logged
as a failed publish and fails nothing; a connection Redis closed is replaced without
losing the next wake; ``close`` reads what is still due.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis

from runfleet.broker.blocking import MAX_UNREAD, BlockingRedis, UnansweredXadds
from runfleet.broker.codec import FIELD
from runfleet.broker.streams import Lane
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus


def noop(n: int) -> int:
    return n


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


def _stream(queue: Queue) -> str:
    return queue._inline.queue().streams.stream_key(queue.name, Lane.NORMAL)


async def test_the_wake_is_on_its_stream_before_its_reply_is_read(
    settings: Settings, store: Store
) -> None:
    def admit() -> tuple[int, int, str]:
        with Queue("default", settings=settings) as queue:
            job = queue.enqueue(noop, 1, job_id="unanswered-1")
            sender = queue._inline.queue().session._unanswered
            assert sender is not None
            unread = sender.unread  # the caller never read its reply
            with _client(settings) as peek:  # another connection sees the entry already
                entries = peek.xrange(_stream(queue))
            return unread, len(entries), job.id

    unread, entries, run_id = await asyncio.to_thread(admit)
    assert unread == 1
    assert entries == 1
    row = await store.runs.get(run_id)
    assert row is not None and row.status is RunStatus.PENDING


def test_replies_are_read_once_arrived_and_never_pile_up(settings: Settings) -> None:
    with _client(settings) as client:
        sender = UnansweredXadds(client)
        key = f"{settings.redis_prefix}:unanswered-test"
        sender.send([(key, b"first")], maxlen=100_000)
        assert sender.unread == 1  # written, not waited for
        time.sleep(0.05)  # its reply has arrived
        sender.send([(key, b"second")], maxlen=100_000)
        assert sender.unread == 1  # the first's reply was read before the second went
        seen: list[int] = []
        for i in range(3 * MAX_UNREAD):  # faster than Redis answers: past the cap, waited
            sender.send([(key, f"m{i}".encode())], maxlen=100_000)
            seen.append(sender.unread)
        assert max(seen) <= MAX_UNREAD
        sender.close()
        assert sender.unread == 0
        assert client.xlen(key) == 3 * MAX_UNREAD + 2
        client.delete(key)


def test_an_error_reply_is_logged_and_fails_nothing(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with _client(settings) as client:
        key = f"{settings.redis_prefix}:not-a-stream"
        good = f"{settings.redis_prefix}:a-stream"
        client.set(key, "a string, so XADD answers WRONGTYPE")
        sender = UnansweredXadds(client)
        with caplog.at_level(logging.WARNING, logger="runfleet.producer.queue"):
            sender.send([(key, b"x")], maxlen=10)  # returns: nothing is waited for
            time.sleep(0.05)
            sender.send([(good, b"y")], maxlen=10)  # reads the error reply first
            failed = [r for r in caplog.records if r.getMessage() == "enqueue.publish_failed"]
            assert [r.__dict__["runs"] for r in failed] == [1], caplog.records
            sender.close()
        assert client.xlen(good) == 1  # the next wake went, on the same connection
        client.delete(key, good)


def test_a_connection_redis_closed_is_replaced_for_the_next_wake(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with _client(settings) as client:
        key = f"{settings.redis_prefix}:unanswered-killed"
        sender = UnansweredXadds(client)
        sender.send([(key, b"first")], maxlen=100)
        conn = sender._conn
        assert conn is not None and conn._sock is not None
        host, port = conn._sock.getsockname()[:2]
        time.sleep(0.05)
        sender.send([(key, b"read")], maxlen=100)  # "first"'s reply read: nothing owed now
        time.sleep(0.05)
        sender.send([(key, b"owed")], maxlen=100)
        sender._read(conn, wait=True)  # every reply read: the connection owes nothing
        killed = client.client_kill_filter(addr=f"{host}:{port}")  # Redis drops it
        assert killed == 1
        time.sleep(0.05)  # its FIN has reached the sender's socket
        with caplog.at_level(logging.DEBUG, logger="runfleet.producer.queue"):
            sender.send([(key, b"second")], maxlen=100)  # on a new connection, not the dead one
        events = [r.getMessage() for r in caplog.records]
        assert "enqueue.wake_connection_replaced" in events, events
        assert "enqueue.publish_failed" not in events, events  # nothing was owed: none lost
        assert sender._conn is not None and sender._conn._sock is not None
        assert sender._conn._sock.getsockname()[1] != port  # another socket
        sender.close()
        entries = [e[1][FIELD] for e in client.xrange(key)]
        assert entries == [b"first", b"read", b"owed", b"second"], entries
        client.delete(key)


def test_a_blocking_client_closes_its_sender(settings: Settings) -> None:
    blocking = BlockingRedis.for_settings(settings)
    key = f"{settings.redis_prefix}:unanswered-close"
    blocking.unanswered.send([(key, b"x")], maxlen=10)
    blocking.close()
    assert blocking.unanswered.unread == 0
    with _client(settings) as client:
        assert client.xlen(key) == 1
        client.delete(key)
