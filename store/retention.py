"""Retention: settled runs and everything that belongs to them are deleted in bounded batches.

One implementation serves ``runfleet prune`` and the workers' retention loop: a pass
walks the settled runs oldest first with a keyset cursor, one short statement per
batch (store/sql/retention.sql), so a pass over a million runs never holds a lock
longer than one batch, and rows it must keep (a lineage or a relative still open)
cost one scan per pass instead of blocking the rows behind them.

Two scans share the statement and its rules. ``Scan.SETTLED`` walks runs settled before
a fleet cutoff (``RUNFLEET_RETENTION``, ``runfleet prune --settled-before``);
``Scan.EXPIRY`` walks runs whose own TTL has passed (rq's ``result_ttl`` /
``failure_ttl``, an index on the expiry that holds only runs with a TTL, so with none
the pass is one empty probe). Either way a run with a TTL of its own is due by that
TTL only (negative: never), one without by the fleet cutoff, and a lineage or relative
still open or not due keeps the whole unit.

A dry run executes exactly the same statements inside transactions that are rolled
back: its counts are what a real pass would have deleted at that moment, not an
estimate from a second copy of the selection rules.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import partial
from typing import NamedTuple

from runfleet.store.db import Conn, Database
from runfleet.store.queries import q

MIN_KEY = -(2**63)

PRUNED_TABLES = frozenset(
    {"runs", "journal", "steps", "attempts", "deferreds", "clocks", "run_parents"}
    | {"run_events", "run_messages"}  # migration 0015 (store/events.py)
)
"""Every table whose rows belong to a run; ``tests/retention`` proves it is all of them."""

NO_CUTOFF = MIN_KEY
"""``before_ms`` when no fleet-wide retention applies: only runs' own TTLs make them due."""


class Scan(StrEnum):
    """Which keyset a pass walks (``prune_batch``'s ``scan``)."""

    SETTLED = "settled"
    """Runs settled before the fleet cutoff, by settlement time."""
    EXPIRY = "expiry"
    """Runs whose own TTL has passed, by expiry time."""


DEFAULT_BATCH = 500

LEASE_MS = 60_000
"""How long a retention pass's lease lasts unrenewed (database time). The pass renews it
after every batch and gives it back at its end: only a process that dies mid-pass holds
retention off, for at most this long."""
"""Runs scanned per batch: tens of milliseconds of locks on a small server."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a pass stands in the keyset of settled runs (settle time, run id)."""

    after_ms: int = MIN_KEY
    after_id: str = ""


START = Cursor()


@dataclass(frozen=True, slots=True)
class Deleted:
    """Rows deleted (or, in a dry run, that would be), per table."""

    runs: int = 0
    journal: int = 0
    steps: int = 0
    attempts: int = 0
    deferreds: int = 0
    clocks: int = 0
    edges: int = 0

    def __add__(self, other: Deleted) -> Deleted:
        return Deleted(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                          for f in fields(self)})  # fmt: skip

    @property
    def rows(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch: what it deleted, how many settled runs it read, where the next starts."""

    deleted: Deleted
    scanned: int
    next: Cursor
    seconds: float

    @property
    def exhausted(self) -> bool:
        """The scan reached the end of the runs settled before the cutoff."""
        return self.next == START


@dataclass(frozen=True, slots=True)
class Pass:
    """A walk over settled runs: totals, and where to continue if it stopped early."""

    before_ms: int
    now_ms: int
    dry_run: bool
    deleted: Deleted = Deleted()
    scanned: int = 0
    batches: int = 0
    longest_batch_s: float = 0.0
    next: Cursor = START
    complete: bool = False
    """True when the walk reached the end of the keyset (``next`` is then the start)."""


class Cutoff(NamedTuple):
    """``Retention.cutoff``'s answer, on the database clock."""

    before_ms: int
    """Runs settled before this are old enough."""
    now_ms: int
    """Database-now, read by the same statement."""


class Retention:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._holder: str | None = None
        """This process's retention lease while ``exclusive`` holds it (renewed per batch)."""

    async def cutoff(self, older_than_ms: int) -> Cutoff:
        """Runs settled before database-now minus ``older_than_ms``, and database-now."""
        row = await self._db.one("retention.cutoff", {"older_than_ms": older_than_ms})
        assert row is not None
        return Cutoff(int(row["before_ms"]), int(row["now_ms"]))

    async def batch(
        self,
        before_ms: int,
        now_ms: int,
        *,
        scan: Scan = Scan.SETTLED,
        after: Cursor = START,
        limit: int = DEFAULT_BATCH,
    ) -> Batch:
        """One batch, committed on its own (a single statement on an autocommit connection)."""
        async with self._db.pool.connection() as conn:
            done = await _batch(conn, before_ms, after, limit, now_ms=now_ms, scan=scan)
        if self._holder is not None:  # the pass goes on: its lease with it
            await self._take(self._holder)
        return done

    async def prune(
        self,
        before_ms: int,
        now_ms: int,
        *,
        batch: int = DEFAULT_BATCH,
        dry_run: bool = False,
        scan: Scan = Scan.SETTLED,
        after: Cursor = START,
        max_batches: int | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Pass:
        """Walk batches from ``after`` to the end (or ``max_batches``, or ``should_stop``).

        ``now_ms`` (database time) is when runs' own TTLs are judged; ``before_ms`` is the
        fleet cutoff for runs without one (``NO_CUTOFF``: none of those is due).

        A dry run walks in ONE transaction that is rolled back at the end, so a lineage
        or an edge that spans two batches is counted once, as a real pass deletes it;
        the price is that its row locks (on settled runs only, which no worker takes)
        last for the whole dry run instead of one batch.
        """
        if batch < 1:
            raise ValueError("batch must be >= 1")
        if dry_run:
            async with self._db.pool.connection() as conn:
                async with conn.transaction(force_rollback=True):
                    return await self._walk(
                        partial(_batch, conn, now_ms=now_ms, scan=scan), before_ms, now_ms,
                        batch, True, after, max_batches, should_stop,
                    )  # fmt: skip

        async def committed(before: int, cursor: Cursor, limit: int) -> Batch:
            return await self.batch(before, now_ms, scan=scan, after=cursor, limit=limit)

        return await self._walk(
            committed, before_ms, now_ms, batch, False, after, max_batches, should_stop
        )

    @staticmethod
    async def _walk(
        one: Callable[[int, Cursor, int], Awaitable[Batch]],
        before_ms: int,
        now_ms: int,
        limit: int,
        dry_run: bool,
        after: Cursor,
        max_batches: int | None,
        should_stop: Callable[[], bool],
    ) -> Pass:
        deleted, scanned, batches, longest = Deleted(), 0, 0, 0.0
        cursor = after
        while True:
            done = await one(before_ms, cursor, limit)
            cursor = done.next
            deleted += done.deleted
            scanned += done.scanned
            batches += 1
            longest = max(longest, done.seconds)
            if (
                done.exhausted
                or should_stop()
                or (max_batches is not None and batches >= max_batches)
            ):
                return Pass(
                    before_ms=before_ms,
                    now_ms=now_ms,
                    dry_run=dry_run,
                    deleted=deleted,
                    scanned=scanned,
                    batches=batches,
                    longest_batch_s=longest,
                    next=cursor,
                    complete=done.exhausted,
                )

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[bool]:
        """Hold the fleet's retention lease for a pass, if no other process holds it.

        The lease is the retention row of ``runfleet.sweep_leases`` (migration 0031),
        which only the worker role may write: no producer or operator login can hold
        retention off. Each batch commits on its own, so no transaction spans the pass:
        the row is a timed lease (``LEASE_MS``, database time), renewed after every batch
        and given back at the end; a process that dies mid-pass holds it until it expires.
        """
        holder = f"{self._db.source_id}:{secrets.token_hex(4)}"
        if not await self._take(holder):
            yield False
            return
        self._holder = holder
        try:
            yield True
        finally:
            self._holder = None
            await self._db.execute("retention.drop_lease", {"holder": holder})

    async def _take(self, holder: str) -> bool:
        """Take (or renew) the retention lease for ``holder``; False if another holds it."""
        row = await self._db.one("retention.take_lease", {"holder": holder, "lease_ms": LEASE_MS})
        return row is not None

    async def prune_keys(
        self, *, batch: int = DEFAULT_BATCH, should_stop: Callable[[], bool] = lambda: False
    ) -> int:
        """Delete the concurrency keys no open run needs, in batches; how many went.

        A key's row (its round-robin turn and per-key bucket) goes once no run of it is
        pending, running or suspended and its bucket is full again: a key that comes back
        later starts fresh, as a new key (the front of the turn, a full bucket), which is
        what its state would have been worth. Rows an admission or a claim holds are kept
        for the next pass (``retention.prune_keys``).
        """
        if batch < 1:
            raise ValueError("batch must be >= 1")
        total, after = 0, ("", "")
        while True:
            row = await self._db.one(
                "retention.prune_keys",
                {"after_queue": after[0], "after_key": after[1], "limit": batch},
            )
            assert row is not None, "prune_keys always answers one row"
            deleted = int(row["deleted"])
            total += deleted
            if deleted < batch or should_stop():
                return total
            after = (row["last_queue"], row["last_key"])

    async def known_queues(self) -> list[str]:
        """Queues workers registered flows on (where their stream consumers live)."""
        return [r["queue"] for r in await self._db.all("retention.known_queues")]

    async def run_keyed_tables(self) -> set[str]:
        """Tables in the schema with a column naming a run (run_id, child_id, parent_id)."""
        rows = await self._db.all("retention.run_keyed_tables")
        return {r["table_name"] for r in rows} | {"runs"}


async def _batch(
    conn: Conn, before_ms: int, after: Cursor, limit: int, *, now_ms: int, scan: Scan
) -> Batch:
    """Run one ``prune_batch`` statement on ``conn`` and read its one-row answer."""
    params = {
        "scan": scan.value,
        "before_ms": before_ms,
        "now_ms": now_ms,
        "after_ms": after.after_ms,
        "after_id": after.after_id,
        "limit": limit,
    }
    started = time.monotonic()
    cur = await conn.execute(q("retention.prune_batch"), params)
    row = await cur.fetchone()
    seconds = time.monotonic() - started
    assert row is not None, "prune_batch always answers one row"
    scanned = int(row["scanned"])
    nxt = (
        Cursor(int(row["last_ms"]), row["last_id"])
        if scanned == limit and row["last_id"] is not None
        else START
    )
    deleted = Deleted(**{f.name: int(row[f.name]) for f in fields(Deleted)})
    return Batch(deleted, scanned, nxt, seconds)
