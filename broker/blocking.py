"""A blocking Redis client behind the awaitable surface the producer's calls use.

``rqface.sync.Queue`` drives its one-statement calls in the caller's thread
(``store.inline.drive``): the queue's own coroutines, which must never suspend. Their
Redis writes (``Streams.publish``/``publish_many``, a wake hint) await ``xadd``, a
pipeline, or a script; here each is a blocking redis-py call wrapped in a coroutine that
completes at once. Only those calls exist: anything else (a subscription, a blocking
read) is an attribute error, never a silent event-loop hop. An admission's wake does not
wait at all: ``UnansweredXadds`` writes it and reads its reply later.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, Self

import redis
from redis.connection import Connection

from runfleet.broker.client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SOCKET_TIMEOUT
from runfleet.broker.codec import FIELD
from runfleet.store.config import Settings

# The producer's logger (docs/reference/logs.md): a wake refused is logged as any failed
# publish of an enqueue's wake is.
log = logging.getLogger("runfleet.producer.queue")

MAX_UNREAD = 512
"""The most replies ``UnansweredXadds`` leaves unread before it waits for them."""


class _Script:
    def __init__(self, script: Any) -> None:
        self._script = script

    async def __call__(self, keys: Any = None, args: Any = None) -> Any:
        return self._script(keys=keys, args=args)


class _Pipeline:
    """``async with redis.pipeline() as pipe``: commands queue, ``execute`` sends them."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._pipe.reset()

    def xadd(self, *args: Any, **kwargs: Any) -> Self:
        self._pipe.xadd(*args, **kwargs)
        return self

    async def execute(self) -> list[Any]:
        return list(self._pipe.execute())


class UnansweredXadds:
    """``XADD``s nobody waits for: a blocking producer's wake messages, sent and left.

    An enqueue's wake is a hint (the lost-wake sweep covers one that never arrives) and
    its entry id is never read, so waiting for Redis's reply only kept the caller a round
    trip longer (docs/explanation/admission-path.md). Each ``send`` writes its
    commands to a connection of this object's own and returns; the replies are read at a
    later ``send`` once they have arrived (or, past ``MAX_UNREAD``, waited for), and at
    ``close`` (which a ``Queue`` does when closed, collected or at interpreter exit). An
    error reply is logged as a failed publish is. A broken connection is dropped with the
    replies it still owed (logged as failed publishes: Redis may or may not have taken
    them) and the next ``send`` opens another; one Redis closed with nothing owed is only
    replaced. A process killed right after ``enqueue`` may lose its last wakes, as a
    crash between the commit and the ``XADD`` always could: the sweep covers them. One
    lock, held for the write (and past ``MAX_UNREAD`` for the reads): the sync ``Queue``
    may be shared by threads. A forked child starts over with a lock and a connection of
    its own, never its parent's socket.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._unread = 0
        self._pid = os.getpid()

    @property
    def unread(self) -> int:
        """Replies written for and not read yet."""
        return self._unread

    def send(self, packed: Sequence[tuple[str, bytes]], maxlen: int) -> None:
        """``XADD key MAXLEN ~ maxlen * FIELD data`` for each item, without waiting."""
        commands = [("XADD", key, "MAXLEN", "~", maxlen, "*", FIELD, data) for key, data in packed]
        if not commands:
            return
        self._after_fork()
        with self._lock:
            conn = self._connection()
            try:
                self._read(conn, wait=self._unread + len(commands) > MAX_UNREAD)
            except Exception as exc:  # the connection broke since: these go on a new one
                self._dropped(exc)
                conn = self._connection()
            try:
                packed_commands = conn.pack_commands(commands)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
                conn.send_packed_command(packed_commands, check_health=False)  # type: ignore[no-untyped-call]  # same
            except Exception:
                self._drop()
                raise
            self._unread += len(commands)

    def close(self) -> None:
        """Read the replies still due (each bounded by the socket timeout), then let go."""
        self._after_fork()
        with self._lock:
            if self._conn is None:
                return
            try:
                self._read(self._conn, wait=True)
            except Exception as exc:
                self._dropped(exc)
                return
            conn, self._conn = self._conn, None
            self._pool.release(conn)

    def _after_fork(self) -> None:
        """In a forked child: a lock and a connection of its own (the parent's lock may be
        held by a thread the child does not have; the socket is the parent's)."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._conn, self._unread, self._pid = None, 0, os.getpid()

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._pool.get_connection()
        return self._conn

    def _dropped(self, exc: BaseException) -> None:
        """The connection failed: the replies it owed are lost publishes, if any."""
        if self._unread:
            log.warning("enqueue.publish_failed", extra={"runs": self._unread, "error": repr(exc)})
        else:  # Redis closed it with nothing owed (its idle timeout, a restart): no wake lost
            log.debug("enqueue.wake_connection_replaced", extra={"error": repr(exc)})
        self._drop()

    def _read(self, conn: Connection, *, wait: bool) -> None:
        """Read the replies that have arrived (all that are due if ``wait``). With none
        due, a readable connection is one Redis closed: reading (or, with hiredis, the
        readability test itself) raises, and the caller takes a new one rather than write
        into a socket nobody reads."""
        while (wait and self._unread) or conn.can_read(timeout=0):
            if not self._unread:
                conn.read_response()
                raise redis.ConnectionError("a reply nobody asked for on the wake connection")
            try:
                conn.read_response()
            except redis.ResponseError as exc:
                log.warning("enqueue.publish_failed", extra={"runs": 1, "error": repr(exc)})
            self._unread -= 1

    def _drop(self) -> None:
        conn, self._conn, self._unread = self._conn, None, 0
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            with contextlib.suppress(Exception):
                self._pool.release(conn)  # reconnected by the pool when taken again


class BlockingRedis:
    """The subset of ``redis.asyncio.Redis`` a driven producer call awaits, blocking."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.connection_pool = client.connection_pool  # require_binary, socket_timeout_of
        self.unanswered = UnansweredXadds(client)
        """The enqueue's wakes, sent without waiting for their replies."""

    @classmethod
    def for_settings(cls, settings: Settings) -> Self:
        """Same options as ``broker.client.connect`` (bytes replies, the same timeouts)."""
        return cls(
            redis.Redis.from_url(
                settings.redis_url,
                decode_responses=False,
                socket_timeout=DEFAULT_SOCKET_TIMEOUT,
                socket_connect_timeout=DEFAULT_CONNECT_TIMEOUT,
            )
        )

    def register_script(self, script: str) -> _Script:
        return _Script(self._client.register_script(script))

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self._client.pipeline(transaction=transaction))

    async def xadd(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.xadd(*args, **kwargs)

    def close(self) -> None:
        self.unanswered.close()
        self._client.close()
