"""Postgres: the single source of truth for runs, the journal, waits, clocks and the run DAG."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from runfleet.store.admit import Admission
from runfleet.store.config import Settings
from runfleet.store.dag import Dag
from runfleet.store.db import Conn, Database, default_source_id, open_pool
from runfleet.store.deferreds import Deferreds
from runfleet.store.events import Events
from runfleet.store.inspect import Inspect
from runfleet.store.journal import Journal, Kind
from runfleet.store.lifecycle import Lifecycle
from runfleet.store.queues import Queues
from runfleet.store.registry import FlowRegistry
from runfleet.store.runs import Runs
from runfleet.store.stats import Stats
from runfleet.store.steps import Steps
from runfleet.store.sweeps import SweepKind, Sweeps
from runfleet.store.timeouts import StepTimeouts
from runfleet.store.waits import Waits

__all__ = ["Kind", "Settings", "Store", "SweepKind"]


class Store:
    """The store's operations, grouped by concept, over one pool and one transaction boundary.

    ``async with store.transaction():`` makes every operation inside it atomic;
    nested blocks become savepoints.
    """

    def __init__(
        self, db: Database, settings: Settings, *, serves: Collection[str] | None = None
    ) -> None:
        self.db = db
        self.settings = settings
        self.journal = Journal(db)
        self.dag = Dag(db, self.journal)
        self.runs = Runs(db, self.journal, settings, serves)
        self.admission = Admission(db, self.journal, self.dag, settings)
        self.lifecycle = Lifecycle(db, self.journal, settings, self.admission, self.dag)
        self.deferreds = Deferreds(db, self.journal, settings)
        self.waits = Waits(db, self.journal, settings, self.deferreds)
        self.sweeps = Sweeps(db, settings)
        self.stats = Stats(db)
        self.inspect = Inspect(db)
        self.steps = Steps(db, self.journal, settings)
        self.flows = FlowRegistry(db)
        self.queues = Queues(db)
        self.events = Events(db, self.journal, settings, self.steps, self.waits)
        self.timeouts = StepTimeouts(db)

    @classmethod
    async def open(
        cls,
        settings: Settings,
        *,
        source_id: str | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        statement_timeout_ms: int | None = None,
        lock_timeout_ms: int | None = None,
        checkout_timeout: float = 30.0,
        serves: Collection[str] | None = None,
        pool_name: str = "runfleet",
        open_timeout: float = 30.0,
    ) -> Store:
        """Open a pool and the store over it; ``statement_timeout_ms`` overrides the setting
        for this store's connections only, ``lock_timeout_ms`` bounds every lock wait of
        its statements (a worker's store: ``Settings.worker_lock_wait_ms``; a lock wait
        past it fails LockNotAvailable, which the row writes a worker makes answer as
        ``RowLocked``), ``checkout_timeout`` bounds the wait for one (see
        ``store.db.open_pool``). ``serves``: the queues a worker's claims are limited
        to (``store.runs.Runs``); None for a store that claims nothing or serves all."""
        pool = await open_pool(
            settings,
            min_size=min_size,
            max_size=max_size,
            statement_timeout_ms=statement_timeout_ms,
            lock_timeout_ms=lock_timeout_ms,
            checkout_timeout=checkout_timeout,
            name=pool_name,
            open_timeout=open_timeout,
        )
        return cls(Database(pool, source_id or default_source_id()), settings, serves=serves)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self.db.transaction() as conn:
            yield conn

    async def close(self) -> None:
        await self.db.pool.close()
