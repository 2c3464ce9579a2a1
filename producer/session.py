"""A producer's session: its connections, its scopes, and how every call reaches Postgres.

``ProducerSession`` is what every producer collaborator is built with: admission
(``producer.queue.AsyncQueue``), the calls on an existing run (``producer.control``), its
events and messages (``producer.messages``) and its history (``producer.history``). It holds
the store and the Redis client once connected, the producer's scopes, and the three
things each call shares:

- ``available``: a Postgres call with transient errors retried for
  ``RUNFLEET_PRODUCER_RETRY_FOR`` seconds, then ``Unavailable`` naming the service;
- ``authorized``: the run's row, if its scopes are covered by the producer's;
- ``hint`` / ``publish_ready``: the stream message after a committed change, a hint that
  never fails the call (the lost-wake sweep covers a lost one).

A test builds one over an open store and a Redis client (``attach``), with no queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple, TypeVar

from psycopg_pool import PoolTimeout
from redis.asyncio import Redis

from runfleet.broker.blocking import UnansweredXadds
from runfleet.broker.codec import message_for
from runfleet.broker.notify import Notifier
from runfleet.broker.streams import Lane, Streams, lane_for
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer.trust import producer_scopes
from runfleet.runtime.batching import GroupCommit
from runfleet.store import Store, reach, validate
from runfleet.store.config import Settings
from runfleet.store.errors import RunNotFound, ScopeDenied, Unavailable
from runfleet.store.transient import is_transient, retrying, service_of
from runfleet.store.types import RunRow, RunStatus

# The producer's logger: one name for every producer log event (docs/reference/logs.md).
log = logging.getLogger("runfleet.producer.queue")
T = TypeVar("T")

READ_GROUP = 256
"""The most reads of concurrent tasks one ``runs.get_many`` answers (``shared_read``)."""


class Connections(NamedTuple):
    """What ``ProducerSession.detach`` hands back for its caller to close."""

    store: Store | None
    redis: Redis | None


class ProducerSession:
    """One producer's store, Redis client, scopes and retry budget."""

    def __init__(self, settings: Settings, scopes: Iterable[str] = ()) -> None:
        self.settings = settings
        self.scopes = producer_scopes(scopes)
        self._store: Store | None = None
        self._redis: Redis | None = None
        self._streams: Streams | None = None
        self._notifier: Notifier | None = None
        self._unanswered: UnansweredXadds | None = None
        # Reads of concurrent tasks (the waits woken by one settled batch's notices) share
        # one statement: a read joins the next batch, sent after it was asked, so it sees
        # every commit made before it was called (``shared_read``).
        self._reads: GroupCommit[str, RunRow | None] = GroupCommit(
            self._read_many, max_items=READ_GROUP, name="read"
        )

    def attach(
        self, *, store: Store, redis: Redis, unanswered: UnansweredXadds | None = None
    ) -> None:
        """Use ``store`` and ``redis`` (the session owns neither until ``close``).

        ``unanswered``: admissions' wakes are written there and not waited for (the
        blocking face's; ``publish_ready``)."""
        self._store = store
        self._redis = redis
        self._unanswered = unanswered
        self._streams = Streams(redis, self.settings.redis_prefix)
        self._notifier = Notifier(redis, self.settings.redis_prefix)

    def detach(self) -> Connections:
        """Forget the store and Redis client, handing them back for the caller to close."""
        held = Connections(self._store, self._redis)
        self._store = self._redis = None
        self._unanswered = None
        return held

    @property
    def connected(self) -> bool:
        return self._store is not None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError("queue is not connected: use `async with AsyncQueue(...)`")
        return self._store

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            raise RuntimeError("queue is not connected: use `async with AsyncQueue(...)`")
        return self._redis

    @property
    def streams(self) -> Streams:
        if self._streams is None:
            raise RuntimeError("queue is not connected: use `async with AsyncQueue(...)`")
        return self._streams

    @property
    def notifier(self) -> Notifier:
        if self._notifier is None:
            raise RuntimeError("queue is not connected: use `async with AsyncQueue(...)`")
        return self._notifier

    async def available(
        self, call: Callable[[], Awaitable[T]], *, retried: list[BaseException] | None = None
    ) -> T:
        """``call`` with transient errors retried for the producer budget, then Unavailable.

        ``retried`` collects the errors retried past, for callers whose write is not
        idempotent on its own: a retry after a lost answer may find its own commit.
        """

        def on_retry(attempt: int, exc: BaseException) -> None:
            if retried is not None:
                retried.append(exc)
            log.warning(
                "producer.retry",
                extra={"attempt": attempt, "service": service_of(exc), "error": repr(exc)},
            )

        started = time.monotonic()
        try:
            return await retrying(
                call, give_up_after=self.settings.producer_retry_for, on_retry=on_retry
            )
        except Exception as exc:
            if is_transient(exc):
                raise self.unavailable(exc, time.monotonic() - started) from None
            raise

    def unavailable(
        self, exc: BaseException, waited: float, pool_name: str | None = None
    ) -> Unavailable:
        """The give-up after ``waited`` s: the service, its host:port, the cause, the fix.

        A ``PoolTimeout`` only says no connection was handed out in time; the cause is
        the pool's last failed connection attempt (``store.reach``), named instead."""
        service = service_of(exc)
        cause: BaseException = exc
        url = self.settings.redis_url
        if service == "postgres":
            url = self.settings.database_url
            if pool_name is None and self._store is not None:
                pool_name = self._store.db.pool_name
            if isinstance(exc, PoolTimeout) and pool_name is not None:
                cause = reach.last_attempt(pool_name) or exc
        return Unavailable(service, exc, reach.explain(service, url, cause, waited))

    async def shared_read(self, run_id: str) -> RunRow | None:
        """The run's row as one read sees it, read after this call began.

        Reads asked while another is in flight, or in the same event-loop turn, go out
        together as one ``runs.get_many``: the waits of one settled batch read their runs
        in one statement instead of one each. A read inside this task's transaction, or
        driven in a blocking caller's thread, is its own statement (``shares_reads``).
        """
        if not self.store.db.shares_reads:
            return await self.available(lambda: self.store.runs.get(run_id))
        return await self._reads.submit(run_id)

    async def _read_many(self, run_ids: Sequence[str]) -> list[RunRow | None]:
        wanted = sorted(set(run_ids))
        rows = await self.available(lambda: self.store.runs.get_many(wanted))
        found = {row.id: row for row in rows}
        return [found.get(run_id) for run_id in run_ids]

    async def drain_reads(self) -> None:
        """Wait for the reads in flight (before the store they use is closed)."""
        await self._reads.drain()

    async def authorized(self, run_id: str) -> RunRow:
        """The run's row, if it exists and this producer's scopes cover the run's."""
        validate.identifier("run_id", run_id)
        row = await self.shared_read(run_id)
        if row is None:
            raise RunNotFound(run_id)
        missing = sorted(set(row.scopes) - set(self.scopes))
        if missing:
            raise ScopeDenied(run_id, missing)
        return row

    async def answering(self, run_id: str) -> RunRow:
        """The row that answers for ``run_id`` now, scope-checked: the run itself, or the
        round that resumed it (``resume_run`` resumes under the id the caller holds, as
        DBOS does; the settled round stays settled, DESIGN §3), followed to the newest."""
        row = await self.authorized(run_id)
        seen = {row.id}
        while row.status.terminal and row.resumed_as and row.resumed_as not in seen:
            row = await self.authorized(row.resumed_as)
            seen.add(row.id)
        return row

    async def hint(self, run_id: str, reason: WakeReason, row: RunRow | None = None) -> None:
        """Wake the run's queue after a committed change; never fails the producer call.

        ``row`` is the run as the caller already read it (queue, flow and epoch are what
        the wake needs), so the hint costs no read of its own; without one it reads.
        """
        try:
            if row is None:
                row = await self.store.runs.get(run_id)
            if row is None:
                return
            # A woken run already started: its wake takes the recovery lane, ahead of any backlog.
            await self.streams.publish(
                row.queue, message_for(row.id, row.flow, reason), lane_for(row.epoch)
            )
        except Exception as exc:  # the lost-wake sweep covers it
            log.warning("wake.publish_failed", extra={"run_id": run_id, "error": repr(exc)})

    async def publish_ready(self, rows: list[RunRow], *, lane: Lane) -> None:
        """One stream message per admitted run that may start now (a hint: never fails);
        rq's at_front runs go to the recovery lane, read before any backlog."""
        ready = [row for row in rows if row.status is RunStatus.PENDING and row.waiting is None]
        messages = [
            (row.queue, message_for(row.id, row.flow, WakeReason.ENQUEUE, "schedule"))
            for row in ready
        ]
        try:
            if self._unanswered is not None:
                self._unanswered.send(self.streams.pack(messages, lane), self.streams.maxlen)
            else:
                await self.streams.publish_many(messages, lane)
        except Exception as exc:
            log.warning("enqueue.publish_failed", extra={"runs": len(messages), "error": repr(exc)})
