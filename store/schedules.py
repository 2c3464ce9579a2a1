"""Periodic schedules: definitions, and firing a due tick exactly once across the fleet.

Exactly once per tick is not a leader election. Every worker's scheduler may try to
fire a due schedule; ``fire`` locks the schedule row (``SKIP LOCKED``: a row another
scheduler holds is left to it), admits the due tick's run and moves ``next_tick_ms``
past it in ONE transaction, the move compared-and-set on the ``next_tick_ms`` it read.
A scheduler killed mid-fire rolls back whole and the tick stays due for the next one.
The run id is derived from the tick (``sched:{name}@{tick}``), so an admission that is
repeated anyway (a schedule removed and added again) joins the tick's run.

Policies: ``catch_up`` (ticks missed while no scheduler ran: 0 = skip them, N = admit
up to N of them, the most recent) and ``overlap`` (``skip``: a tick whose previous run
is still open is not admitted, only counted). A tick is *missed* only if it fell due
more than ``grace_ms`` ago: a scheduler that is merely a second late admits it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, assert_never

from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.admit import Admission
from runfleet.store.config import Settings
from runfleet.store.cron import Cron, InvalidSchedule, iso
from runfleet.store.db import Database
from runfleet.store.errors import ExecutionIdentityConflict
from runfleet.store.runs import Runs
from runfleet.store.stats import Stats
from runfleet.store.types.options import AdmissionOptions, Tick
from runfleet.store.types.outcomes import Created, CreateOutcome, Joined
from runfleet.store.types.run import JsonValue, NewRun, RunRow

if TYPE_CHECKING:
    from runfleet.store import Store

__all__ = ["Cron", "InvalidSchedule", "Overlap", "Schedule", "ScheduleSpec", "Schedules"]

RUN_ID_PREFIX = "sched:"


class Overlap(StrEnum):
    ALLOW = "allow"
    """Admit every tick, whether or not the previous run has settled."""
    SKIP = "skip"
    """Do not admit a tick while the previous run of the schedule is still open."""


class Origin(StrEnum):
    DECORATOR = "decorator"
    CLI = "cli"


def overlap_of(value: Overlap | str) -> Overlap:
    try:
        return Overlap(value)
    except ValueError:
        allowed = ", ".join(o.value for o in Overlap)
        raise InvalidSchedule("overlap", f"{value!r} is not one of {allowed}") from None


def tick_run_id(name: str, tick_ms: int) -> str:
    """The run id of one tick: the idempotency key that makes a tick admit one run."""
    return f"{RUN_ID_PREFIX}{name}@{iso(tick_ms)}"


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule is: which flow, with what payload, where, when, under which policies."""

    name: str
    flow: str
    cron: Cron
    queue: str = "default"
    payload: JsonValue = None
    scopes: tuple[str, ...] = ()
    catch_up: int = 0
    overlap: Overlap = Overlap.ALLOW
    timeout_ms: int | None = None
    max_rounds: int | None = None
    origin: Origin = Origin.CLI

    def __post_init__(self) -> None:
        validate.identifier("schedule name", self.name)
        if len(self.name) > 200:
            raise InvalidSchedule("name", f"is {len(self.name)} characters, the limit is 200")
        validate.identifier("flow", self.flow)
        validate.identifier("queue", self.queue)
        for scope in self.scopes:
            validate.identifier("scopes", scope)
        if isinstance(self.catch_up, bool) or not isinstance(self.catch_up, int):
            raise InvalidSchedule("catch_up", f"must be an integer >= 0, got {self.catch_up!r}")
        if self.catch_up < 0:
            raise InvalidSchedule(
                "catch_up", f"must be >= 0 (0 skips missed ticks), got {self.catch_up}"
            )
        object.__setattr__(self, "overlap", overlap_of(self.overlap))


def for_flow(
    flow: str,
    queue: str,
    expression: str,
    timezone: str,
    *,
    kwargs: dict[str, JsonValue] | None = None,
    catch_up: int = 0,
    overlap: Overlap | str = Overlap.ALLOW,
    timeout: float | None = None,
    max_rounds: int | None = None,
) -> ScheduleSpec:
    """A decorated flow's schedule (named after the flow), validated at decoration time:
    a bad cron, time zone, policy or payload raises here, at import, not in a worker."""
    payload: JsonValue = {"args": [], "kwargs": dict(kwargs or {})}
    values.check(payload, "schedule_kwargs")
    return ScheduleSpec(
        name=flow,
        flow=flow,
        cron=Cron(expression, timezone),
        queue=queue,
        payload=payload,
        catch_up=catch_up,
        overlap=overlap_of(overlap),
        timeout_ms=validate.timeout_ms(timeout) if timeout is not None else None,
        max_rounds=max_rounds,
        origin=Origin.DECORATOR,
    )


@dataclass(frozen=True)
class Schedule:
    """A schedule row as stored, with the database time it was read at."""

    spec: ScheduleSpec
    paused: bool
    next_tick_ms: int
    last_tick_ms: int | None
    last_run_id: str | None
    admitted: int
    missed: int
    overlapped: int
    created_at_ms: int
    updated_at_ms: int
    now_ms: int

    @property
    def name(self) -> str:
        return self.spec.name


def _schedule(row: DictRow) -> Schedule:
    spec = ScheduleSpec(
        name=row["name"],
        flow=row["flow"],
        cron=Cron(row["cron"], row["timezone"]),
        queue=row["queue"],
        payload=row["payload"],
        scopes=tuple(row["scopes"] or ()),
        catch_up=int(row["catch_up"]),
        overlap=Overlap(row["overlap"]),
        timeout_ms=row["timeout_ms"],
        max_rounds=row["max_rounds"],
        origin=Origin(row["origin"]),
    )
    return Schedule(
        spec=spec,
        paused=bool(row["paused"]),
        next_tick_ms=int(row["next_tick_ms"]),
        last_tick_ms=row["last_tick_ms"],
        last_run_id=row["last_run_id"],
        admitted=int(row["admitted"]),
        missed=int(row["missed"]),
        overlapped=int(row["overlapped"]),
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
        now_ms=int(row["now_ms"]),
    )


@dataclass(frozen=True)
class Fired:
    """A due schedule was fired by this caller: what it admitted, joined and skipped."""

    schedule: Schedule
    admitted: list[RunRow]
    """Runs this firing created (the caller publishes their wakes)."""
    joined: int
    """Ticks whose run already existed (joined, or a conflicting run holds the id)."""
    missed: int
    overlapped: int


@dataclass(frozen=True)
class NotDue:
    """Nothing to fire: not due any more, paused, removed, or another scheduler holds it."""

    name: str


FireOutcome = Fired | NotDue


class Schedules:
    def __init__(self, db: Database, runs: Runs, admission: Admission, settings: Settings) -> None:
        self._db = db
        self._runs = runs
        self._admission = admission
        self._settings = settings
        self._stats = Stats(db)
        """Database time (``Stats.now_ms``): a first tick is the first after it."""

    @classmethod
    def of(cls, store: Store) -> Schedules:
        """The schedules over an open store's pool (one transaction boundary with its runs)."""
        return cls(store.db, store.runs, store.admission, store.settings)

    def _params(self, spec: ScheduleSpec, next_tick_ms: int) -> dict[str, Any]:
        return {
            "name": spec.name,
            "flow": spec.flow,
            "queue": spec.queue,
            "cron": spec.cron.expression,
            "timezone": spec.cron.timezone,
            "payload": values.encode_canonical(
                spec.payload, self._settings.max_payload_bytes, "payload"
            ),
            "scopes": Jsonb(sorted(set(spec.scopes))),
            "catch_up": spec.catch_up,
            "overlap": spec.overlap.value,
            "timeout_ms": spec.timeout_ms,
            "max_rounds": spec.max_rounds,
            "origin": spec.origin.value,
            "next_tick_ms": next_tick_ms,
        }

    async def add(self, spec: ScheduleSpec) -> Schedule | None:
        """Create a schedule whose first tick is the first after now; None if the name is taken."""
        first = spec.cron.next_after(await self._stats.now_ms())
        row = await self._db.one("schedules.insert", self._params(spec, first))
        return _schedule(row) if row else None

    async def upsert(self, spec: ScheduleSpec) -> Schedule | None:
        """Write a decorated flow's schedule; the row if it changed, None if identical.

        Idempotent across a fleet of workers starting at once: an unchanged definition
        keeps its next tick (restarting workers never re-fire or skip a tick).
        """
        first = spec.cron.next_after(await self._stats.now_ms())
        row = await self._db.one("schedules.upsert", self._params(spec, first))
        return _schedule(row) if row else None

    async def get(self, name: str) -> Schedule | None:
        row = await self._db.one("schedules.get", {"name": name})
        return _schedule(row) if row else None

    async def all(self) -> list[Schedule]:
        return [_schedule(row) for row in await self._db.all("schedules.list")]

    async def pause(self, name: str) -> Schedule | None:
        row = await self._db.one("schedules.pause", {"name": name})
        return _schedule(row) if row else None

    async def resume(self, name: str) -> Schedule | None:
        """Unpause; the next tick is the first after now (ticks while paused never fire).

        None if there is no such schedule; an unpaused one is returned unchanged.
        """
        async with self._db.transaction():
            row = await self._db.one("schedules.get_for_update", {"name": name})
            if row is None:
                return None
            current = _schedule(row)
            if not current.paused:
                return current
            following = current.spec.cron.next_after(current.now_ms)
            resumed = await self._db.one(
                "schedules.resume", {"name": name, "next_tick_ms": following}
            )
            assert resumed is not None  # the row is locked and paused
            return _schedule(resumed)

    async def remove(self, name: str) -> bool:
        """Delete the schedule. Runs it admitted stay; a decorated flow's worker re-adds it
        at its next start (remove the ``schedule=`` from the code to retire it)."""
        return await self._db.one("schedules.remove", {"name": name}) is not None

    async def due(self, limit: int) -> list[str]:
        return [row["name"] for row in await self._db.all("schedules.due", {"limit": limit})]

    async def fire(self, name: str, *, grace_ms: int) -> FireOutcome:
        """Admit the schedule's due ticks and advance it, in one transaction.

        Due ticks are those from ``next_tick_ms`` up to now (database time). Ticks
        due for at most ``grace_ms`` are on time and always admitted, and so is the latest
        due tick however late; of the older ones (missed while no scheduler ran) the
        ``catch_up`` most recent are admitted too, the rest counted as missed.
        With ``overlap=skip`` a tick is not admitted while the schedule's previous run
        is open. Every skipped tick is counted on the row (``missed``, ``overlapped``).
        """
        async with self._db.transaction():
            row = await self._db.one("schedules.lock_due", {"name": name})
            if row is None:
                return NotDue(name)
            schedule = _schedule(row)
            spec, now = schedule.spec, schedule.now_ms
            # Ticks have a one-second resolution: at most grace_ms // 1000 + 1 are on time.
            keep = spec.catch_up + grace_ms // 1000 + 2
            # In a thread: near a DST change a one-second cron walks an hour of wall times,
            # CPU the worker's event loop (leases, watchdog stamps) must not wait for.
            due = await asyncio.to_thread(spec.cron.due, schedule.next_tick_ms, now, keep)
            if not due.ticks:  # clock_timestamp() moved between the WHERE and the list
                return NotDue(name)
            on_time = {t for t in due.ticks if t >= now - grace_ms}
            late = [t for t in due.ticks[:-1] if t < now - grace_ms]
            caught_up = late[len(late) - spec.catch_up :] if spec.catch_up else []
            chosen = sorted(on_time | {due.ticks[-1]} | set(caught_up))
            missed = due.count - len(chosen)
            previous = schedule.last_run_id
            admitted: list[RunRow] = []
            joined = overlapped = 0
            last_tick: int | None = None
            for tick in chosen:
                if spec.overlap is Overlap.SKIP and await self._open(previous):
                    overlapped += 1
                    continue
                last_tick, previous = tick, tick_run_id(spec.name, tick)
                match await self._admit(spec, tick, late=tick < now - grace_ms):
                    case Created(created):
                        admitted.append(created)
                    case Joined(_) | None:
                        joined += 1
                    case unreachable:
                        assert_never(unreachable)
            advanced = await self._db.one(
                "schedules.advance",
                {
                    "name": name,
                    "expected_tick_ms": schedule.next_tick_ms,
                    "next_tick_ms": due.next_tick_ms,
                    "last_tick_ms": last_tick,
                    "last_run_id": previous if last_tick is not None else None,
                    "admitted": len(admitted),
                    "missed": missed,
                    "overlapped": overlapped,
                },
            )
            assert advanced is not None  # the row is locked since lock_due read it
            return Fired(_schedule(advanced), admitted, joined, missed, overlapped)

    async def _open(self, run_id: str | None) -> bool:
        if run_id is None:
            return False
        row = await self._runs.get(run_id)
        return row is not None and not row.status.terminal

    async def _admit(self, spec: ScheduleSpec, tick_ms: int, *, late: bool) -> CreateOutcome | None:
        """The tick's run, created or joined: the producers' admission (``Admission.create``:
        row + ``created`` record, in a savepoint of the firing transaction).

        None when the id is held by a run with another identity (the schedule's payload
        changed after an earlier admission of this very tick): that tick already ran.
        """
        new = NewRun(
            id=tick_run_id(spec.name, tick_ms),
            flow=spec.flow,
            queue=spec.queue,
            payload=spec.payload,
            scopes=spec.scopes,
            timeout_ms=spec.timeout_ms,
            max_rounds=spec.max_rounds,
            # In the run's state, for explain and tests: which tick, and whether it was
            # admitted late (caught up, or the latest tick after an outage).
            options=AdmissionOptions(origin=Tick(spec.name, tick_ms, late)),
        )
        try:
            return await self._admission.create(new)
        except ExecutionIdentityConflict:
            return None
