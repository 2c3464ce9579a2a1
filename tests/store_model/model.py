"""A pure-Python reference of the run state machine (DESIGN §3) that the store must match.

The model knows nothing about SQL: each operation maps the model's rows to the outcome the
store must answer and the rows it must leave behind. Owners and runs are small integers;
the driver translates them to ``Owner`` objects and run ids. A race of several operations
may end in any serial order, so ``predict`` returns every (outcome, world) it allows.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from runfleet.store.config import Settings
from runfleet.store.journal import Kind
from runfleet.store.types import RunStatus

MAX_RECOVERIES: int = Settings.model_fields["max_recoveries"].default
"""The store's limit on takeovers in a row (the model's store uses the default settings)."""


class Lease(enum.Enum):
    """The model's heartbeat right after a renewal: the database picks the value."""

    RENEWED = "renewed"


HeartbeatValue: TypeAlias = int | Lease | None
RUNNABLE = frozenset({RunStatus.PENDING, RunStatus.SUSPENDED})


@dataclass(frozen=True, slots=True)
class Snap:
    """The claim snapshot in model terms (the claim columns stay empty in this model)."""

    status: RunStatus
    owner: int | None
    heartbeat: HeartbeatValue


@dataclass(frozen=True, slots=True)
class RunModel:
    status: RunStatus
    owner: int | None
    epoch: int
    heartbeat: HeartbeatValue
    cancel_requested: bool
    waiting: str | None
    kinds: tuple[str, ...]
    """Journal record kinds the store must hold for this run, in order."""
    recoveries: int = 0
    """Takeovers in a row: each steal counts one, any owner's park or settlement resets."""

    @classmethod
    def created(cls) -> RunModel:
        return cls(RunStatus.PENDING, None, 0, None, False, None, (Kind.CREATED,))

    @property
    def snap(self) -> Snap:
        return Snap(self.status, self.owner, self.heartbeat)

    def owned_by(self, owner: int, epoch: int) -> bool:
        return self.status is RunStatus.RUNNING and self.owner == owner and self.epoch == epoch

    def journaled(self, kind: str) -> RunModel:
        return replace(self, kinds=(*self.kinds, kind))


World: TypeAlias = tuple[RunModel, ...]
Expect: TypeAlias = str | tuple[object, ...]
"""An outcome's class name, or for a heartbeat ("Heartbeat", confirmed, cancel_requested)."""


# ---- operations (concrete arguments; the driver resolves beliefs into them) ----------------


@dataclass(frozen=True, slots=True)
class ClaimActivate:
    run: int
    owner: int
    snap: Snap


@dataclass(frozen=True, slots=True)
class Steal:
    run: int
    owner: int
    snap: Snap
    forced: bool
    """Forced: stale_after_ms far negative, so any lease is stale by database time."""
    lease: Literal["stale", "fresh", "unknown"]
    """What the driver measured of the lease age before the call (default threshold)."""


@dataclass(frozen=True, slots=True)
class Renew:
    owner: int
    runs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Settle:
    run: int
    owner: int
    epoch: int
    to: RunStatus


@dataclass(frozen=True, slots=True)
class Park:
    run: int
    owner: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Suspend:
    """``transition_owned`` to suspended with a wait: the CAS and its record in one statement."""

    run: int
    owner: int
    epoch: int
    guard: bool


@dataclass(frozen=True, slots=True)
class Wake:
    run: int


@dataclass(frozen=True, slots=True)
class RequestCancel:
    run: int


@dataclass(frozen=True, slots=True)
class AckCancel:
    run: int
    owner: int
    epoch: int


Single: TypeAlias = (
    ClaimActivate | Steal | Renew | Settle | Park | Suspend | Wake | RequestCancel | AckCancel
)


@dataclass(frozen=True, slots=True)
class Race:
    """Operations started together on separate connections."""

    ops: tuple[Single, ...]


Op: TypeAlias = Single | Race


# ---- transitions ------------------------------------------------------------------------


def _released(m: RunModel, kind: str, status: RunStatus, waiting: str | None) -> RunModel:
    """Leaving ``running``: the owner and lease go, the epoch stays as fence history; the
    execution ended cleanly, so the recoveries in a row start again."""
    return replace(
        m.journaled(kind), status=status, owner=None, heartbeat=None, waiting=waiting, recoveries=0
    )


def _claim(m: RunModel, op: ClaimActivate) -> list[tuple[Expect, RunModel]]:
    if m.status in RUNNABLE and m.waiting is None and op.snap == m.snap:
        activated = replace(
            m.journaled(Kind.CLAIMED_AND_ACTIVATED),
            status=RunStatus.RUNNING,
            owner=op.owner,
            epoch=m.epoch + 1,
            heartbeat=Lease.RENEWED,
        )
        return [("Activated", activated)]
    return [("SnapshotChanged", m)]


def _steal(m: RunModel, op: Steal) -> list[tuple[Expect, RunModel]]:
    if op.snap.status is not RunStatus.RUNNING or op.snap.owner is None:
        return [("InvalidInput", m)]
    if op.snap != m.snap:
        return [("SnapshotChanged", m)]
    if m.recoveries >= MAX_RECOVERIES:  # a poison run: parked dead instead of stolen
        taken: tuple[Expect, RunModel] = (
            "DeadLettered",
            replace(
                m.journaled(Kind.DEAD_LETTERED),
                status=RunStatus.SUSPENDED,
                owner=None,
                heartbeat=None,
                waiting="dead",
            ),
        )
    else:
        taken = (
            "Stolen",
            replace(
                m.journaled(Kind.STOLEN_AND_ACTIVATED),
                owner=op.owner,
                epoch=m.epoch + 1,
                heartbeat=Lease.RENEWED,
                recoveries=m.recoveries + 1,
            ),
        )
    if op.forced or op.lease == "stale":
        return [taken]
    if op.lease == "fresh":
        return [("LeaseFresh", m)]
    return [taken, ("LeaseFresh", m)]


def _settle(m: RunModel, op: Settle) -> list[tuple[Expect, RunModel]]:
    if not m.owned_by(op.owner, op.epoch):
        return [("NotOwner", m)]
    if m.cancel_requested:
        return [("GuardFailed", m)]
    return [("Transitioned", _released(m, Kind.TRANSITIONED, op.to, None))]


def _park(m: RunModel, op: Park) -> list[tuple[Expect, RunModel]]:
    if not m.owned_by(op.owner, op.epoch):
        return [("NotOwner", m)]
    if m.cancel_requested:
        return [("GuardFailed", m)]
    return [("Parked", _released(m, Kind.PARKED, RunStatus.SUSPENDED, "event"))]


def _suspend(m: RunModel, op: Suspend) -> list[tuple[Expect, RunModel]]:
    if not m.owned_by(op.owner, op.epoch):
        return [("NotOwner", m)]
    if op.guard and m.cancel_requested:
        return [("GuardFailed", m)]
    return [("Transitioned", _released(m, Kind.TRANSITIONED, RunStatus.SUSPENDED, "quota"))]


def _wake(m: RunModel) -> list[tuple[Expect, RunModel]]:
    if m.waiting is None:
        return [("NotWaiting", m)]
    return [("Woken", replace(m.journaled(Kind.WOKEN), waiting=None))]


def _request_cancel(m: RunModel) -> list[tuple[Expect, RunModel]]:
    if m.status.terminal:
        return [("AlreadyTerminal", m)]
    if m.cancel_requested:
        return [("AlreadyRequested", m)]
    return [("CancelRequested", replace(m.journaled(Kind.CANCEL_REQUESTED), cancel_requested=True))]


def _ack_cancel(m: RunModel, op: AckCancel) -> list[tuple[Expect, RunModel]]:
    # Unguarded: the owner may close its run as cancelled with or without a request.
    if not m.owned_by(op.owner, op.epoch):
        return [("NotOwner", m)]
    return [("Transitioned", _released(m, Kind.INTERRUPTED, RunStatus.CANCELLED, None))]


def _renew(world: World, op: Renew) -> list[tuple[Expect, World]]:
    confirmed = frozenset(
        r for r in op.runs if world[r].status is RunStatus.RUNNING and world[r].owner == op.owner
    )
    cancels = frozenset(r for r in confirmed if world[r].cancel_requested)
    renewed = tuple(
        replace(m, heartbeat=Lease.RENEWED) if i in confirmed else m for i, m in enumerate(world)
    )
    return [(("Heartbeat", confirmed, cancels), renewed)]


def _single(world: World, op: Single) -> list[tuple[Expect, World]]:
    if isinstance(op, Renew):
        return _renew(world, op)
    m = world[op.run]
    match op:
        case ClaimActivate():
            branches = _claim(m, op)
        case Steal():
            branches = _steal(m, op)
        case Settle():
            branches = _settle(m, op)
        case Park():
            branches = _park(m, op)
        case Suspend():
            branches = _suspend(m, op)
        case Wake():
            branches = _wake(m)
        case RequestCancel():
            branches = _request_cancel(m)
        case AckCancel():
            branches = _ack_cancel(m, op)
    return [(expect, _put(world, op.run, new)) for expect, new in branches]


def _put(world: World, run: int, m: RunModel) -> World:
    return tuple(m if i == run else old for i, old in enumerate(world))


def predict(world: World, op: Op) -> list[tuple[Expect, World]]:
    """Every (outcome, resulting world) the store may answer ``op`` with."""
    if not isinstance(op, Race):
        return _single(world, op)
    allowed: list[tuple[Expect, World]] = []
    for order in itertools.permutations(range(len(op.ops))):
        paths: list[tuple[dict[int, Expect], World]] = [({}, world)]
        for index in order:
            paths = [
                ({**seen, index: expect}, after)
                for seen, before in paths
                for expect, after in _single(before, op.ops[index])
            ]
        for seen, after in paths:
            allowed.append((tuple(seen[i] for i in range(len(op.ops))), after))
    return allowed
