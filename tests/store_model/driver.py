"""Drives the real store with resolved operations and holds it to the model after each one.

After every step the outcome's type must be one the model allows, and every row and its
journal must equal the model's. Invariants that hold whatever the model says (terminal is
never left, epochs only grow, a running row has an owner) are checked between raw rows, so
a model bug cannot hide a store bug.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Literal

from hypothesis import event, note
from hypothesis import strategies as st

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.errors import InvalidInput
from runfleet.store.types import (
    Activated,
    Heartbeat,
    NewRun,
    Owner,
    RunRow,
    RunStatus,
    Snapshot,
    Stolen,
    Waiting,
    WaitingReason,
)
from tests.store_model.model import (
    AckCancel,
    ClaimActivate,
    Expect,
    Lease,
    Op,
    Park,
    Race,
    Renew,
    RequestCancel,
    RunModel,
    Settle,
    Single,
    Snap,
    Steal,
    Suspend,
    Wake,
    World,
    predict,
)

OWNERS = RUNS = 3
FORCED_STALE_MS = -1_000_000
"""A threshold no lease can beat: the steal is judged stale by the database clock at once."""

IntentKind = Literal[
    "claim",
    "steal",
    "heartbeat",
    "settle",
    "park",
    "suspend",
    "wake",
    "cancel",
    "ack",
    "race_claim",
    "race_steal",
    "race_cancel_settle",
    "race_cancel_park",
    "race_cancel_suspend",
]
KINDS: tuple[IntentKind, ...] = (
    # Weighted by repetition: claims keep runs running, where most rules have teeth.
    "claim",
    "claim",
    "claim",
    "settle",
    "settle",
    "steal",
    "steal",
    "ack",
    "park",
    "suspend",
    "heartbeat",
    "wake",
    "wake",
    "cancel",
    "race_claim",
    "race_steal",
    "race_cancel_settle",
    "race_cancel_park",
    "race_cancel_suspend",
)


@dataclass(frozen=True, slots=True)
class Intent:
    """What hypothesis draws; resolved against the driver's beliefs into a concrete Op."""

    kind: IntentKind
    run: int
    owner: int
    pick: int
    """Chooses a fence (owner + epoch) or an older snapshot; see ``Driver._fence``."""
    fresh: bool
    """Use the snapshot and fence the model holds now, rather than stale or forged ones."""


INTENTS = st.builds(
    Intent,
    kind=st.sampled_from(KINDS),
    run=st.integers(0, RUNS - 1),
    owner=st.integers(0, OWNERS - 1),
    pick=st.integers(0, 11),
    fresh=st.booleans(),
)


class Driver:
    """Runs resolved operations against the store and keeps the model in step with it."""

    def __init__(self, store: Store) -> None:
        prefix = uuid.uuid4().hex[:10]
        self.store = store
        self.ids = [f"model-{prefix}-r{i}" for i in range(RUNS)]
        self.index = {run_id: i for i, run_id in enumerate(self.ids)}
        self.owners = [
            Owner(f"model-{prefix}-h{i % 2}", 4000 + i, f"{prefix}n{i}") for i in range(OWNERS)
        ]
        self.world: World = tuple(RunModel.created() for _ in range(RUNS))
        self.rows: list[RunRow] = []
        self.history: list[list[Snap]] = [[m.snap] for m in self.world]
        """Every snapshot each run has shown: where stale snapshots come from."""
        self.believed: dict[tuple[int, int], int] = {}
        """(owner, run) -> the epoch that owner was last granted for that run."""

    async def start(self) -> None:
        for run_id in self.ids:
            await self.store.admission.create(NewRun(id=run_id, flow="model.flow"))
        self.rows = [await self._row(i) for i in range(RUNS)]
        await self.sync()

    # ---- resolving intents -------------------------------------------------

    def _snap(self, intent: Intent, *, running: bool = False) -> Snap:
        """The model's snapshot now, or one the run showed earlier (a stale read).

        ``running`` limits stale picks to leased snapshots, the only ones a steal takes.
        """
        current = self.world[intent.run].snap
        seen = [s for s in self.history[intent.run] if s.status is RunStatus.RUNNING or not running]
        if intent.fresh or not seen:
            return current
        return seen[intent.pick % len(seen)]

    def _fence(self, intent: Intent, mode: int | None = None) -> tuple[int, int]:
        """An (owner, epoch) pair: believed, the true fence, a stale epoch, or an impostor.

        ``fresh`` intents use the true fence, so settlements succeed often enough to matter.
        """
        m = self.world[intent.run]
        current = m.owner if m.owner is not None else intent.owner
        if mode is None:
            mode = 1 if intent.fresh else (0, 2, 3)[intent.pick % 3]
        match mode:
            case 0:
                return intent.owner, self.believed.get((intent.owner, intent.run), m.epoch)
            case 1:
                return current, m.epoch
            case 2:
                return current, m.epoch - 1
            case _:
                return intent.owner, m.epoch

    async def _lease(self, run: int) -> Literal["stale", "fresh", "unknown"]:
        """Judge the lease by database time before a default-threshold steal.

        Fresh only with a wide margin (half the threshold), so a slow machine turns a
        prediction into "either", never into a false failure.
        """
        row = await self._row(run)
        if row.heartbeat_at_ms is None:
            return "unknown"
        age = row.now_ms - row.heartbeat_at_ms
        threshold = self.store.settings.stale_after_ms
        if age > threshold:
            return "stale"
        return "fresh" if age < threshold // 2 else "unknown"

    async def resolve(self, intent: Intent) -> Op:
        run = intent.run
        match intent.kind:
            case "claim":
                return ClaimActivate(run, intent.owner, self._snap(intent))
            case "steal":
                forced = intent.pick % 2 == 0
                lease = "stale" if forced else await self._lease(run)
                return Steal(run, intent.owner, self._snap(intent, running=True), forced, lease)
            case "heartbeat":
                if not intent.fresh:
                    runs = tuple(r for r in range(RUNS) if not (intent.pick >> r) & 1)
                    return Renew(intent.owner, runs)
                # The usual heartbeat: an owner that holds something renews everything.
                holders = [m.owner for m in self.world if m.owner is not None] or [intent.owner]
                return Renew(holders[intent.pick % len(holders)], tuple(range(RUNS)))
            case "settle":
                to = RunStatus.COMPLETED if intent.pick % 2 else RunStatus.FAILED
                return Settle(run, *self._fence(intent), to)
            case "park":
                return Park(run, *self._fence(intent))
            case "suspend":
                return Suspend(run, *self._fence(intent), guard=intent.pick < 6)
            case "wake":
                return Wake(run)
            case "cancel":
                return RequestCancel(run)
            case "ack":
                return AckCancel(run, *self._fence(intent))
            case "race_claim":
                snap = self._snap(intent)
                return Race(tuple(ClaimActivate(run, o, snap) for o in range(OWNERS)))
            case "race_steal":
                snap = self._snap(intent, running=True)
                return Race(tuple(Steal(run, o, snap, True, "stale") for o in range(OWNERS)))
            case "race_cancel_settle":
                owner, epoch = self._fence(intent, mode=1)
                return Race((Settle(run, owner, epoch, RunStatus.COMPLETED), RequestCancel(run)))
            case "race_cancel_park":
                return Race((Park(run, *self._fence(intent, mode=1)), RequestCancel(run)))
            case "race_cancel_suspend":
                owner, epoch = self._fence(intent, mode=1)
                return Race((Suspend(run, owner, epoch, guard=True), RequestCancel(run)))

    # ---- executing ---------------------------------------------------------

    def _snapshot(self, snap: Snap) -> Snapshot:
        assert not isinstance(snap.heartbeat, Lease), "snapshots are taken after a sync"
        owner = self.owners[snap.owner] if snap.owner is not None else None
        return Snapshot(snap.status, owner, snap.heartbeat, None)

    async def _single(self, op: Single) -> Expect:
        store = self.store
        match op:
            case Renew():
                ids = [self.ids[r] for r in op.runs]
                beat = await store.runs.heartbeat(self.owners[op.owner], ids)
                return self._describe_heartbeat(beat)
            case ClaimActivate():
                me = self.owners[op.owner]
                outcome: object = await store.runs.claim_and_activate(
                    self.ids[op.run], self._snapshot(op.snap), me
                )
            case Steal():
                try:
                    outcome = await store.runs.steal(
                        self.ids[op.run],
                        self._snapshot(op.snap),
                        self.owners[op.owner],
                        jr.ProbeEvidence(probe="model"),
                        stale_after_ms=FORCED_STALE_MS if op.forced else None,
                    )
                except InvalidInput:
                    return "InvalidInput"
            case Settle():
                outcome = await store.lifecycle.transition_owned(
                    self.ids[op.run], self.owners[op.owner], op.epoch, op.to, guard=True
                )
            case Park():
                outcome = await store.waits.park(
                    self.ids[op.run],
                    self.owners[op.owner],
                    op.epoch,
                    Waiting(reason=WaitingReason.EVENT),
                )
            case Wake():
                outcome = await store.waits.wake(self.ids[op.run])
            case RequestCancel():
                outcome = await store.lifecycle.request_cancel(self.ids[op.run], note="model")
            case Suspend():
                outcome = await store.lifecycle.transition_owned(
                    self.ids[op.run],
                    self.owners[op.owner],
                    op.epoch,
                    RunStatus.SUSPENDED,
                    guard=op.guard,
                    waiting=Waiting(reason=WaitingReason.QUOTA, wake_at_ms=None),
                )
            case AckCancel():
                outcome = await store.lifecycle.acknowledge_cancel(
                    self.ids[op.run], self.owners[op.owner], op.epoch
                )
        if isinstance(op, ClaimActivate | Steal) and isinstance(outcome, Activated | Stolen):
            self.believed[(op.owner, op.run)] = outcome.row.epoch
        return type(outcome).__name__

    def _describe_heartbeat(self, beat: Heartbeat) -> Expect:
        confirmed = frozenset(self.index[r] for r in beat.confirmed)
        return ("Heartbeat", confirmed, frozenset(self.index[r] for r in beat.cancel_requested))

    async def execute(self, op: Op) -> Expect:
        if not isinstance(op, Race):
            return await self._single(op)
        # Each task takes its own pooled connection, so the operations really contend for
        # the row; a task group leaves no straggler running into the next example.
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._single(o)) for o in op.ops]
        return tuple(t.result() for t in tasks)

    # ---- checking ----------------------------------------------------------

    async def step(self, intent: Intent) -> None:
        op = await self.resolve(intent)
        allowed = predict(self.world, op)
        actual = await self.execute(op)
        note(f"{op} -> {actual}")
        event(f"{intent.kind}: {actual}")
        worlds = [world for expect, world in allowed if expect == actual]
        assert worlds, (
            f"{op} answered {actual}; the model allows {sorted({str(e) for e, _ in allowed})}"
        )
        assert len(set(worlds)) == 1, f"the model is ambiguous about {op} -> {actual}"
        self.world = worlds[0]
        await self.sync()

    async def _row(self, run: int) -> RunRow:
        row = await self.store.runs.get(self.ids[run])
        assert row is not None, f"run {self.ids[run]} vanished"
        return row

    def _owner_index(self, owner: Owner | None) -> int | None:
        if owner is None:
            return None
        assert owner in self.owners, f"a row names an owner nobody is: {owner}"
        return self.owners.index(owner)

    async def sync(self) -> None:
        """Compare every row and journal with the model; adopt the heartbeats the db chose."""
        synced: list[RunModel] = []
        for run in range(RUNS):
            row = await self._row(run)
            check_invariants(self.rows[run], row)
            expected = self.world[run]
            if expected.heartbeat is Lease.RENEWED:
                assert row.heartbeat_at_ms is not None, f"{row.id}: a renewal left no lease"
                expected = replace(expected, heartbeat=row.heartbeat_at_ms)
            records = await self.store.journal.records(row.id)
            observed = RunModel(
                status=row.status,
                owner=self._owner_index(row.owner),
                epoch=row.epoch,
                heartbeat=row.heartbeat_at_ms,
                cancel_requested=row.cancel_requested_at_ms is not None,
                waiting=row.waiting.reason if row.waiting else None,
                kinds=tuple(r.kind for r in records),
                recoveries=row.recoveries,
            )
            assert observed == expected, f"{row.id}: store {observed} != model {expected}"
            assert row.claim is None, f"{row.id}: no operation here leaves a claim behind"
            self.rows[run] = row
            if expected.snap not in self.history[run]:
                self.history[run].append(expected.snap)
            synced.append(expected)
        self.world = tuple(synced)


def check_invariants(before: RunRow, after: RunRow) -> None:
    """Rules of DESIGN §3 that hold between any two reads of a row, model or no model."""
    run = after.id
    if before.status.terminal:
        assert after.status is before.status, f"{run}: left terminal {before.status}"
        assert after.epoch == before.epoch, f"{run}: a settled run was re-fenced"
    assert after.epoch >= before.epoch, f"{run}: epoch went back {before.epoch} -> {after.epoch}"
    running = after.status is RunStatus.RUNNING
    assert running == (after.owner is not None), f"{run}: {after.status} with owner {after.owner}"
    assert running == (after.heartbeat_at_ms is not None), f"{run}: lease without a running row"
    if after.status is RunStatus.COMPLETED:
        # A request that landed first fails the guarded settle; one that comes later is
        # refused (AlreadyTerminal). Either way a completed row carries none.
        assert after.cancel_requested_at_ms is None, f"{run}: completed despite a cancel request"
    if before.epoch == after.epoch and running and before.owner == after.owner:
        assert before.heartbeat_at_ms is not None and after.heartbeat_at_ms is not None
        assert after.heartbeat_at_ms >= before.heartbeat_at_ms, f"{run}: lease went back"
    if after.waiting is not None:
        assert after.status is RunStatus.SUSPENDED, f"{run}: waits while {after.status}"
