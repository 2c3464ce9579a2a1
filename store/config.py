"""The one settings object: every knob is a ``RUNFLEET_*`` environment variable."""

from __future__ import annotations

import random
import re
import socket
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration shared by producers, workers and the CLI.

    Lease timing lives here (not in each caller) because every process in a
    fleet must agree on it: a worker that renews every ``heartbeat_interval``
    is only stealable after ``stale_after`` of database time without renewal.
    """

    model_config = SettingsConfigDict(env_prefix="RUNFLEET_", extra="ignore")

    database_url: str = ""
    """Unset (empty) means no database is configured: a process then uses the embedded
    pair when the ``embedded`` extra is installed (``store.urls.resolve``), and refuses
    with ``NoServers`` otherwise. Never a default host: a database nobody named is one
    somebody else's data may live in."""
    read_database_url: str | None = None
    """A replica for operators' reads (``runs``, ``show``, ``journal``, ``tree``,
    ``explain``, ``fleet``, the dashboard's pages): never for a decision. Unset: they
    read ``database_url``."""
    redis_url: str = ""
    """Unset (empty): as ``database_url``. Both are set, or neither."""
    redis_prefix: str = "runfleet"
    host_id: str = Field(default_factory=socket.gethostname)
    heartbeat_interval: float = Field(default=1.0, gt=0)
    stale_after: float = Field(default=5.0, gt=0)
    sweep_interval: float = Field(default=1.0, gt=0)
    sweep_batch: int = Field(default=64, gt=0)
    grace_period: float = Field(default=10.0, ge=0)
    pool_min: int = Field(default=1, ge=1)
    pool_max: int = Field(default=8, ge=1)
    max_payload_bytes: int = Field(default=1_000_000, gt=0)
    inline_sleep_max: float = Field(default=2.0, ge=0)
    """A durable sleep whose remainder is at most this is slept in-process, holding its slot."""
    park_backoff_over: float = Field(default=5.0, ge=0)
    """A step retry backoff longer than this parks the run on a timer instead of a slot."""
    refresh_statistics: bool = True
    """The sweeper ANALYZEs each runfleet table whose committed rows at least doubled
    since Postgres last counted them (``runfleet.analyze_grown``): plans cached on a young
    table are made again instead of reading a grown table by sequential scans until
    autovacuum's next ANALYZE (docs/explanation/admission-path.md)."""
    idle_peek: bool = False
    """An idle worker claims a run straight from its doorbell's entry (one Redis round trip
    less per idle start, docs/explanation/admission-path.md). Off by default: every idle
    worker's doorbell rings, so each claims the run in Postgres (all but one lose: N-1
    statements per start in a fleet of N idle workers) and the fastest host takes all idle
    work."""

    @property
    def heartbeat_interval_ms(self) -> int:
        return int(self.heartbeat_interval * 1000)

    @property
    def stale_after_ms(self) -> int:
        return int(self.stale_after * 1000)

    @property
    def sweep_lock_idle_ms(self) -> int:
        """How long a sweep tick's transaction may sit idle before Postgres ends its session.

        A tick holds its kind's lease for the whole transaction, so every other
        worker skips that kind while it lasts. A tick's own gaps between statements are
        its Python (milliseconds); a tick that goes quiet for longer belongs to a worker
        cut off from Postgres mid-tick, whose session the server would otherwise keep,
        lock and all, until ``idle_in_transaction_timeout`` (a minute by default): no
        stale lease of the fleet would be swept meanwhile. Two heartbeat intervals, at
        least a second: within ``stale_after`` of the cut-off, at the default settings.
        """
        return int(max(1.0, 2 * self.heartbeat_interval) * 1000)

    @property
    def worker_lock_wait_ms(self) -> int:
        """How long any statement of a worker may wait on a lock (its ``lock_timeout``).

        Any producer may hold its own run's row locked (``SELECT ... FOR UPDATE``): a
        sweep that waited on it would hold its kind for the whole fleet, a claim, steal,
        settlement or release that waited would hold a slot and a connection of the
        worker for as long as the tenant liked. Set on every connection of a worker's
        pools (``store.db.connection_kwargs``) and again in a sweep tick's transaction;
        a wait past it fails (``store.db.LockWaitEnded``) and that run alone is set aside
        (``RowLocked``). A quarter of a heartbeat interval, at least 50 ms: far below the
        lease it protects, and far above a worker's own row writes, which hold a lock
        for one statement or one short transaction, so two workers still wait for each
        other (the claim races' rule: the loser re-checks once the winner commits).
        """
        return max(50, self.heartbeat_interval_ms // 4)

    @property
    def lapse_after(self) -> float:
        """Seconds without a confirmed renewal after which a worker stops its runs.

        Two intervals short of ``stale_after`` so that the owner has stopped
        executing before any other process may consider its lease stale.
        """
        return max(self.heartbeat_interval, self.stale_after - 2 * self.heartbeat_interval)

    @property
    def failstop_after(self) -> float:
        """Seconds without a confirmed renewal after which a process still executing exits.

        Half an interval past the lapse, which interrupts every run: a body still
        executing by then cannot be interrupted (a thread, a blocked event loop), and
        the watchdog ends the process — always at least half an interval before any
        observer can see the lease stale.
        """
        return min(
            self.stale_after - self.heartbeat_interval / 2,
            self.lapse_after + self.heartbeat_interval / 2,
        )

    @property
    def failstop_confirm(self) -> float:
        """How long the watchdog must itself see a run overdue before it fires.

        A process frozen by SIGSTOP wakes up overdue; the lapse loop interrupts its
        runs within this window, so only a body that truly cannot stop is fatal.
        """
        return self.heartbeat_interval / 4

    @property
    def stop_deadline(self) -> float:
        """Seconds from a worker process's first stop to its hard exit (worker/stopping.py).

        The grace period, then room for the release that follows it (two intervals, at
        least two seconds): past it nothing a run's code left behind (a thread, a hung
        body) keeps the process alive, and what it still owns goes to takeover.
        """
        return self.grace_period + max(2.0, 2 * self.heartbeat_interval)

    @property
    def renew_timeout(self) -> float:
        """How long one renewal may take before it counts as unconfirmed (one interval)."""
        return self.heartbeat_interval

    @property
    def liveness_timeout(self) -> float:
        """Bound on one liveness-key write or probe read: well under one interval."""
        return min(0.5, self.heartbeat_interval / 2)

    @property
    def liveness_ttl(self) -> float:
        """Seconds a liveness key outlives its last refresh (three intervals)."""
        return 3 * self.heartbeat_interval

    @property
    def woken_grace_ms(self) -> int:
        """How long a run whose wait was answered waits for its own wake before the
        runnable-suspended sweep dispatches it anyway (two sweep intervals)."""
        return int(2 * self.sweep_interval * 1000)

    @property
    def lost_pending_after_ms(self) -> int:
        """The least time between two lost-pending scan cycles (a run left pending after
        its wake was delivered is woken once per cycle, not every tick), and the age at
        which a pending run counts as lost while a worker cannot read Redis at all."""
        return 2 * self.stale_after_ms

    @property
    def wake_publish_grace_ms(self) -> int:
        """How long after its commit an admission's stream message may take to reach Redis
        before the wake marks stop waiting for it (``worker.wake_marks``): stale_after, the
        time after which the fleet treats any silent process as gone."""
        return self.stale_after_ms

    @property
    def wake_claim_grace_ms(self) -> int:
        """How long a reader may take from a delivery to its claim before a run that
        delivery covered counts as lost (``worker.wake_marks``): stale_after."""
        return self.stale_after_ms

    @property
    def lost_wake_within_ms(self) -> int:
        """How soon a never-started run whose wake was lost is dispatched again, counted from
        when its readers reached it (at once for an idle queue, a flushed or deleted stream,
        a refused publish on a caught-up queue): the publish grace, then a sample, its
        witness one claim grace later, the next sample (two of the longest ticks) and the
        next lost-pending cycle (docs/explanation/backlogs.md)."""
        return (
            self.wake_publish_grace_ms
            + self.wake_claim_grace_ms
            + 2 * self.sweep_tick_max_ms
            + self.lost_pending_after_ms
        )

    @property
    def lost_pending_batch(self) -> int:
        """Runs the lost-pending sweep dispatches per tick: 16 sweep batches, so the wakes
        a Redis flush destroyed come back at about a drain's pace, not 64 a second."""
        return 16 * self.sweep_batch

    @property
    def sweep_tick_max_ms(self) -> int:
        """The longest wait between two sweep ticks: ``sweep_interval`` jittered up by
        ``TICK_JITTER`` (``jittered``). A sweep acts on a row within this of it qualifying."""
        return int(self.sweep_interval * (1 + TICK_JITTER) * 1000)

    @property
    def takeover_overdue_ms(self) -> int:
        """How long past stale a lease may stay before a missing takeover is overdue:
        ten of the longest sweep ticks plus five seconds, so a loaded fleet that is merely
        slow is not reported (``explain``, ``runfleet fleet stuck``)."""
        return 10 * self.sweep_tick_max_ms + 5000

    @property
    def due_overdue_ms(self) -> int:
        """How long past due a timed wait may stay before a missed wake is reported:
        three of the longest sweep ticks, at least five seconds."""
        return max(5000, 3 * self.sweep_tick_max_ms)

    @property
    def reprobe_backoff_max(self) -> float:
        """The cap of the backoff between probes of an owner the probe vouched for
        (``worker.evidence.RefusalLadder``: two intervals, doubling): ``stale_after``, so
        a vouched-for owner that stays silent is looked at again once per lease lifetime."""
        return self.stale_after

    @property
    def lapse_check_every(self) -> float:
        """How often the lease checks whether it lapsed: a quarter interval, at most 0.1 s,
        so a lapse interrupts runs well inside the half interval before ``failstop_after``."""
        return min(0.1, self.heartbeat_interval / 4)

    @property
    def loop_beat_every(self) -> float:
        """How often the health check stamps the event loop: twice per heartbeat interval."""
        return self.heartbeat_interval / 2

    @property
    def loop_stall_after(self) -> float:
        """Seconds without a loop stamp after which the worker reports itself stalled:
        three heartbeat intervals, at least ``LOOP_STALL_FLOOR`` (a GC pause is not a stall)."""
        return max(3 * self.heartbeat_interval, LOOP_STALL_FLOOR)

    @property
    def stream_reclaim_every(self) -> float:
        """Seconds between two reclaims of stream entries other consumers left unacknowledged
        (two ``stale_after``): a dead consumer's deliveries are re-read, rarely."""
        return 2 * self.stale_after

    @property
    def stream_reclaim_idle_ms(self) -> int:
        """How long a delivery stays unacknowledged before another consumer reclaims it
        (three ``stale_after``): longer than any live consumer's claim takes."""
        return 3 * self.stale_after_ms

    @property
    def schedule_interval(self) -> float:
        """Seconds between two scheduler passes: the sweep interval, at most one second
        (a one-second cron must not fire late)."""
        return min(1.0, self.sweep_interval)

    @property
    def schedule_grace_ms(self) -> int:
        """How late a schedule tick may be found and still count as on time, not missed.

        Three passes (each jittered up by ``TICK_JITTER``), and at least two seconds: a
        fleet whose schedulers are merely slow (a loaded host, a long pass) never has a
        tick counted missed; only an outage longer than this makes the missed-tick policy
        (``catch_up``) decide.
        """
        return max(2000, int(3 * self.schedule_interval * 1000))

    producer_retry_for: float = Field(default=10.0, ge=0)
    """Seconds a producer call retries a transient error before raising ``Unavailable``."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The worker's event loop: uvloop (libuv; where installed) or the standard one."""
    prepare_threshold: int | None = 5
    """psycopg's automatic prepared statements (executions before preparing); None turns
    them off, as a pooler in transaction mode without prepared-statement support needs."""
    statement_timeout: float = Field(default=30.0, ge=0)
    """Server-side bound on one statement (seconds, 0 = none), set at connection start."""
    idle_in_transaction_timeout: float = Field(default=60.0, ge=0)
    """Server-side bound on a transaction left idle (seconds, 0 = none): a stuck
    process cannot hold row locks for longer than this."""
    connect_timeout: float = Field(default=5.0, ge=0)
    """Seconds to establish a database connection before it counts as failed."""
    tcp_user_timeout: float = Field(default=10.0, ge=0)
    """Seconds unacknowledged data may wait before the kernel drops the connection
    (0 = the OS default, often minutes): a silently cut network fails fast."""

    @field_validator("read_database_url", mode="before")
    @classmethod
    def _no_read_url(cls, value: object) -> object:
        """Empty/``none`` = unset: reads go to ``database_url``."""
        if isinstance(value, str) and value.strip().lower() in ("", "none", "off", "null"):
            return None
        return value

    @field_validator("prepare_threshold", mode="before")
    @classmethod
    def _no_prepare(cls, value: object) -> object:
        """``none``/``off``/empty/negative all mean: never prepare."""
        if isinstance(value, str) and value.strip().lower() in ("", "none", "off", "null"):
            return None
        if isinstance(value, int | str) and int(value) < 0:
            return None
        return value

    retention: float | None = Field(default=None, gt=0)
    """Seconds after settling that a run (with its journal, steps, waits and edges) is
    deleted by the workers' retention loop; unset = never. Accepts ``30d``, ``12h``."""

    @field_validator("retention", mode="before")
    @classmethod
    def _retention_duration(cls, value: object) -> object:
        """A duration as the CLI writes it (``30d``); empty/``off``/``none`` = unset."""
        if isinstance(value, str):
            if value.strip().lower() in ("", "none", "off", "null"):
                return None
            return parse_duration_ms(value) / 1000
        return value

    @property
    def retention_ms(self) -> int | None:
        return None if self.retention is None else int(self.retention * 1000)

    max_children_per_run: int = Field(default=10_000, gt=0)
    """Children (attached or spawned) one run may start; the next fails the run with
    ``LimitExceeded`` (not retried): a loop spawning without bound is a bug, not load."""
    max_steps_per_run: int = Field(default=100_000, gt=0)
    """Durable calls (steps, sleeps, waits, approvals, children) one run may record."""
    otel: bool = False
    """OpenTelemetry traces of runs (the ``otel`` extra; docs/explanation/lifecycle.md): a producer
    carries its current span into the runs it admits, a worker records a span per
    activation, step, attempt, wait and child, and exports its metrics through the
    application's meter provider (``worker.otel_metrics``). Off: nothing is imported or
    recorded."""
    max_answers_per_run: int = Field(default=1_000, gt=0)
    """Answers (``complete``, approve/deny) one run accepts; more are ``LimitExceeded``."""
    max_recoveries: int = Field(default=5, ge=0)
    """Takeovers in a row that may re-activate a run whose executing process was lost
    (``os._exit``, a segfault, an OOM kill, a fail-stop exit); the steal after that parks
    it ``dead`` for an operator (``runfleet resume``) instead of handing it to the next
    worker to kill. 0: the first lost process parks it."""
    allow_import: str = ""
    """Module prefixes whose plain functions a worker may run besides its ``--flows``
    modules, comma-separated (``RUNFLEET_ALLOW_IMPORT=app.tasks,billing``); nothing
    else is ever imported."""

    @property
    def allow_import_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allow_import.split(",") if p.strip())


TICK_JITTER = 0.2
"""Periodic services (sweeper, scheduler, retention) wait their interval ±20 %, so the
workers of a fleet started together do not all tick at the same instant."""
LOOP_STALL_FLOOR = 2.0
"""A stall shorter than this never fails liveness, whatever the heartbeat interval: GC
pauses and a loaded machine must not restart a healthy worker."""


def jittered(seconds: float) -> float:
    """``seconds`` ±``TICK_JITTER``: the wait before a periodic service's next tick."""
    return seconds * random.uniform(1 - TICK_JITTER, 1 + TICK_JITTER)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, None: 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}  # fmt: skip


MAX_DURATION_DAYS = 36_500
MAX_DURATION_MS = MAX_DURATION_DAYS * 86_400_000
"""About a century: past it a duration back from now leaves the range of timestamps a
person means (and, far enough, of a float: ``9`` * 400 days once raised OverflowError)."""


class DurationTooLong(ValueError):
    """A well-formed duration past ``MAX_DURATION_MS``."""


def parse_duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``2h``, ``30d`` (a bare number is seconds) in milliseconds.

    The one grammar for durations: the CLI (``--since``, ``--settled-before``) and
    settings (``RUNFLEET_RETENTION``) read the same words. ``ValueError`` says why not,
    naming the limit (``MAX_DURATION_MS``) when the number is too large.
    """
    match = _DURATION.match(text)
    shown = repr(text) if len(text) <= 60 else repr(text[:60]) + "…"
    if not match:
        raise ValueError(f"bad duration {shown}: use e.g. 90s, 15m, 2h, 30d")
    ms = float(match[1]) * _UNIT_MS[match[2]]
    if not ms <= MAX_DURATION_MS:  # inf too
        raise DurationTooLong(
            f"duration {shown} is too long: the limit is {MAX_DURATION_DAYS}d (about 100 years)"
        )
    return int(ms)
