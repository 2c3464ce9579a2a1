"""How the driver decides a run it was handed: claim it, take it over, or leave it.

``Decider`` is a collaborator the driver holds (``Driver.decider``), as it holds
``Takeover`` and ``Settlement``: everything between "a run id arrived" and "this process
now owns it at a new epoch" (or why not), answered as a ``Decision`` the driver then
executes (``Driver.run_decided``). A stream read of several runs is decided with one
read and one claim statement (``decide_many``, each run's answer taken by
``from_batch``); a lone delivery with one statement that reads and claims
(``delivered``); anything else from its row (``decide``): a runnable row is
claimed and activated, a running row whose lease is stale goes to ``Takeover``, and a
lost race is journaled as ``claim-lost``. A stopping worker (``closed``) claims nothing
by any of these paths: the run's wake is handed back to the fleet instead. The row
decides which pool executes a run: a run whose queue this process does not serve is
never claimed (``Runs.may_claim``, and the claim statements say so again in SQL),
whatever message brought it here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Container, Mapping, Sequence
from typing import assert_never

import runfleet.worker.metrics as metrics
from runfleet.broker import hostile
from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.errors import UnknownFlow
from runfleet.store.journal_records import WakeCause
from runfleet.store.runs import fresh_admission
from runfleet.store.types import (
    Activated,
    ActivateOutcome,
    AtLimit,
    NotFound,
    NotServed,
    Owner,
    RowLocked,
    RunRow,
    RunStatus,
    SnapshotChanged,
    WaitingReason,
)
from runfleet.worker.authoring.flows import Flow
from runfleet.worker.authoring.instances import for_run
from runfleet.worker.authoring.versions import admitted_version, version_carried
from runfleet.worker.evidence import journal_evidence
from runfleet.worker.hand_on import HandOn
from runfleet.worker.outcomes import Decision, DriveOutcome
from runfleet.worker.ports import Hints, LeaseView, Slots
from runfleet.worker.resolver import resolve, runnable
from runfleet.worker.takeover import Takeover
from runfleet.worker.unrunnable import Unrunnable

log = logging.getLogger("runfleet.worker.decisions")

REHINTS_KEPT = 10_000
"""Runs remembered for the re-hint limit (``Decider._not_served``): bounded memory."""


class Decider:
    """The driver's decide half: claim a run, take it over, or say why not.

    Built alone (a test needs a store, an owner, settings and a ``Takeover``); the
    driver hands it the set of runs it executes (``owned``: a run held here is never
    claimed again) and its ports (``worker.ports``: hints, lease, slots). ``close`` makes
    it claim nothing by any path.
    """

    def __init__(
        self,
        store: Store,
        owner: Owner,
        settings: Settings,
        takeover: Takeover,
        *,
        owned: Container[str] = frozenset(),
        hints: Hints | None = None,
        lease: LeaseView | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings
        self.takeover = takeover
        self.owned = owned
        self._hints = hints
        """Wakes (a displaced run's ahead of the backlog: ``_took_slot``), the queue gates
        (a refused run's wake parked, a started one's dropped: ``broker.gate``)."""
        self._lease = lease
        self._slots = slots
        """A rate-refused queue's next token is due in so many ms (``worker.rate_pump``)."""
        self.unrunnable = Unrunnable()
        """Runs this process cannot execute, and why (each logged once; ``worker.burst``)."""
        self._rehinted: dict[str, float] = {}
        # ahead of the backlog: the run keeps its place
        self._hand_on = HandOn(hints.hint_front) if hints is not None else None
        """Wakes of runs of a version this process does not carry (``worker.hand_on``)."""
        self.closed = False
        """The worker is stopping: no claim by any path (``Driver.close``)."""

    def close(self) -> None:
        self.closed = True
        if self._hand_on is not None:
            self._hand_on.close()

    async def decide(self, run_id: str) -> Decision:
        """Read the run's row and decide from it."""
        return await self._decide(await self.store.runs.get(run_id), run_id)

    async def delivered(self, run_id: str, flow_name: str, *, peeked: bool = False) -> Decision:
        """A stream message naming ``flow_name``: read and claim as one statement when it
        is a fresh admission of that flow, else decide from a read (``decide``).
        ``peeked``: the message came from an idle wait's doorbell, which rang for every
        idle reader, so a claim it loses is the expected race, journaled as nothing."""
        decision = await self._decide_delivered(run_id, flow_name, peeked)
        return decision if decision is not None else await self.decide(run_id)

    async def from_batch(self, run_id: str, batch: Awaitable[Mapping[str, Decision]]) -> Decision:
        """This run's answer in a ``decide_many`` it was part of; decided alone (read, then
        claim) when the batch made none for it or failed (the coordinator logs that once)."""
        try:
            decision = (await asyncio.shield(batch)).get(run_id)
        except Exception:  # logged once by the coordinator (run.batch_decide_failed)
            decision = None
        return decision if decision is not None else await self.decide(run_id)

    async def decide_many(self, run_ids: Sequence[str]) -> dict[str, Decision]:
        """Decide the runs one stream read delivered with one read and one claim statement.

        Fresh admissions (pending, never started, not waiting, a flow this process runs,
        no cancel asked) are claimed and activated together, each with its own snapshot
        check and record; settled and unknown ids are decided from the same read. Any
        other run is left out of the answer and its drive decides it alone, as before.
        """
        rows = await self.store.runs.get_many(list(run_ids))
        decisions: dict[str, Decision] = {}
        fresh: list[tuple[RunRow, Flow]] = []
        for row in rows:
            if row.status.terminal:
                decisions[row.id] = Decision(DriveOutcome.TERMINAL)
                continue
            if not self.store.runs.may_claim(row):
                decisions[row.id] = Decision(await self._not_served(row))
                continue
            if (
                self.closed
                or row.id in self.owned
                or not fresh_admission(row)
                or row.cancel_requested_at_ms is not None
                or (self._lease is not None and not self._lease.open())
            ):
                continue
            flow = self._flow(row)
            if flow is not None:
                fresh.append((row, flow))
        found = {row.id for row in rows}
        decisions.update(
            (run_id, Decision(DriveOutcome.NOT_FOUND)) for run_id in run_ids if run_id not in found
        )
        if not fresh:
            return decisions
        outcomes = await self.store.runs.claim_and_activate_many(
            [r for r, _ in fresh], self.owner, ahead_flows=runnable()
        )
        for row, flow in fresh:
            decisions[row.id] = await self._claimed(row, flow, outcomes[row.id])
        return decisions

    async def _decide_delivered(
        self, run_id: str, flow_name: str, peeked: bool = False
    ) -> Decision | None:
        """One statement reads the run and claims it if it is a fresh admission of the
        flow the message named; anything else is decided from that same read. None: the
        usual read-then-decide path applies (a flow this process does not run, a run it
        already owns, a lease it cannot confirm: that path says so)."""
        try:
            flow = resolve(flow_name)
        except UnknownFlow:
            return None
        if flow.version is not None or flow.owner is not None:
            return None  # the claim must read the run's version (instance) first: the usual path
        if (
            self.closed
            or run_id in self.owned
            or (self._lease is not None and not self._lease.open())
        ):
            return None
        fresh = await self.store.runs.claim_if_fresh(
            run_id, flow_name, self.owner, ahead_flows=runnable()
        )
        outcome, seen = fresh.outcome, fresh.seen
        if peeked:
            # Every idle reader's doorbell rang for this run (streams.Streams.read, ``peek``)
            # and one of them claimed it first: a race lost while it claimed, or a run that
            # had started on a fresh lease by the time this read it, is no evidence of
            # anything. Anything else is decided as any delivery is.
            if isinstance(outcome, SnapshotChanged):
                return Decision(DriveOutcome.CLAIM_LOST)
            if (
                outcome is None
                and seen is not None
                and seen.status is RunStatus.RUNNING
                and seen.owner != self.owner
                and seen.heartbeat_at_ms is not None
                and seen.now_ms - seen.heartbeat_at_ms <= self.settings.stale_after_ms
            ):
                return Decision(DriveOutcome.HEARTBEAT_FRESH)
        if outcome is None:
            return await self._decide(seen, run_id)
        assert seen is not None
        return await self._claimed(seen, flow, outcome)

    async def _decide(self, row: RunRow | None, run_id: str) -> Decision:
        if row is None:
            return Decision(DriveOutcome.NOT_FOUND)
        if row.status.terminal:
            return Decision(DriveOutcome.TERMINAL)
        if row.id in self.owned:
            return Decision(DriveOutcome.ALREADY_OWNED)
        if self.closed:
            return await self._hand_back_wake(row)
        if self._lease is not None and not self._lease.open():
            # A process that cannot confirm its own lease takes nothing new: nobody
            # would renew what it claims, and another worker would soon steal it.
            return Decision(DriveOutcome.LEASE_CLOSED)
        if not self.store.runs.may_claim(row):
            return Decision(await self._not_served(row))
        flow = self._flow(row)
        if flow is None and row.cancel_requested_at_ms is None:
            self._hand_on_other_version(row)
            return Decision(DriveOutcome.UNKNOWN_FLOW)
        if row.status is RunStatus.RUNNING:
            if row.owner == self.owner and row.id in self.owned:
                return Decision(DriveOutcome.ALREADY_OWNED)
            return await self.takeover.steal(row, flow)
        return await self._claim(row, flow)

    async def _not_served(self, row: RunRow) -> DriveOutcome:
        """A run of a queue this process does not serve reached it (a message on the wrong
        stream: a Redis writer's, or a stale one): dropped with a rate-limited log line and
        the ``not_served`` claim outcome. A run that may be waiting for a worker gets one
        wake on its own queue's stream (at most once per run per ``stale_after``), so its
        own pool takes it without waiting for the lost-wake sweep."""
        hostile.rate_limited(
            log,
            logging.WARNING,
            "run.not_served",
            run_id=row.id,
            queue=row.queue,
            serves=sorted(self.store.runs.serves or ()),
        )
        if self._hints is None or row.status not in (RunStatus.PENDING, RunStatus.SUSPENDED):
            return DriveOutcome.NOT_SERVED
        now = time.monotonic()
        last = self._rehinted.get(row.id)
        if last is not None and now - last < self.settings.stale_after:
            return DriveOutcome.NOT_SERVED
        if len(self._rehinted) >= REHINTS_KEPT:
            self._rehinted.clear()
        self._rehinted[row.id] = now
        await self._hints.hint(row)
        return DriveOutcome.NOT_SERVED

    def cannot_run(self, row: RunRow) -> str | None:
        """Why this process cannot execute ``row`` (logged once per run); None if it can.
        A run with a cancel request can always be closed here, its flow or not."""
        if row.cancel_requested_at_ms is not None or self._flow(row) is not None:
            return None
        return self.unrunnable.why(row.id) or f"flow {row.flow!r} cannot run here"

    def _hand_on_other_version(self, row: RunRow) -> None:
        """A run of a flow this process has, of a version it does not carry: its wake goes
        back to the stream for a worker that does (a rolling deploy,
        docs/explanation/lifecycle.md)."""
        if self._hand_on is None:
            return
        try:
            found = resolve(row.flow)
        except UnknownFlow:
            return
        if not found.accepts(admitted_version(row)):
            self._hand_on.wake(row, [v for v in (found.version, *found.compatible) if v])

    def _flow(self, row: RunRow) -> Flow | None:
        try:
            found = resolve(row.flow)
        except UnknownFlow as exc:
            if self.unrunnable.first(row.id, str(exc)):
                log.warning(
                    "run.unknown_flow",
                    extra={"run_id": row.id, "flow": row.flow, "error": str(exc)},
                )
            return None
        if not version_carried(found, row, self.unrunnable):
            return None
        return for_run(found, row, self.unrunnable)

    async def _claim(self, row: RunRow, flow: Flow | None) -> Decision:
        if row.waiting is not None:
            if not self._wakeable(row):
                return Decision(DriveOutcome.WAITING)
            await self.store.waits.wake(row.id, cause=WakeCause.by_driver(row.waiting.reason))
            fresh = await self.store.runs.get(row.id)
            if fresh is None:
                return Decision(DriveOutcome.NOT_FOUND)
            row = fresh
        if row.claim is not None:
            recovered = await self.takeover.stranded_claim(row)
            if recovered != DriveOutcome.CLAIM_RECOVERED:
                return Decision(recovered)
            fresh = await self.store.runs.get(row.id)  # claim it in this same drive
            if fresh is None or fresh.status.terminal or fresh.claim is not None:
                return Decision(recovered)
            row = fresh
        if self.closed:  # the worker began to stop while this drive read the row
            return await self._hand_back_wake(row)
        if fresh_admission(row) and row.cancel_requested_at_ms is None:
            # The priority rule holds on this path too (docs/how-to/queues.md): a run driven
            # again (its wake coalesced, a displaced run's re-published wake, a sweep's
            # find) offers its slot to the queue's best fresh admission, as a delivery does.
            offered = await self.store.runs.claim_if_fresh(
                row.id, row.flow, self.owner, ahead_flows=runnable()
            )
            if offered.outcome is not None:
                return await self._claimed(row, flow, offered.outcome)
            # No longer a fresh admission: the snapshot claim below answers why.
        outcome = await self.store.runs.claim_and_activate(row.id, row.snapshot, self.owner)
        return await self._claimed(row, flow, outcome)

    async def _hand_back_wake(self, row: RunRow) -> Decision:
        """A stopping worker claims nothing: the wake that brought this run (acknowledged
        once the drive has decided) goes back to the fleet's stream so another worker
        takes the run now, not at the next sweep."""
        if self._hints is not None and (row.waiting is None or self._wakeable(row)):
            await self._hints.hint(row)
        return Decision(DriveOutcome.STOPPING)

    async def _claimed(self, row: RunRow, flow: Flow | None, outcome: ActivateOutcome) -> Decision:
        """What a claim-and-activate answered: execute it, or journal the lost race."""
        match outcome:
            case Activated(row=activated):
                if activated.id != row.id:
                    flow = await self._took_slot(row, activated)
                if activated.limited and self._hints is not None:
                    await self._hints.started(activated)
                if activated.epoch == 1:
                    metrics.ENQUEUE_TO_START.observe(
                        max(0, activated.now_ms - activated.created_at_ms) / 1000
                    )
                return Decision.activated(DriveOutcome.ACTIVATED, activated, flow)
            case SnapshotChanged(current=current):
                await journal_evidence(
                    self.store,
                    row.id,
                    current.owner,
                    current.heartbeat_at_ms,
                    jr.ClaimLost(observer=self.owner.key, status=current.status.value),
                )
                return Decision(DriveOutcome.CLAIM_LOST)
            case NotServed(current=current):
                return Decision(await self._not_served(current))
            case AtLimit(current=current, retry_after_ms=retry_after_ms):
                # Nothing changed; the wake waits at the queue's gate for a freed slot, or
                # for the rate's next token: then this process opens the gate itself (every
                # refused worker may: a wake too many is refused again, never lost).
                if self._hints is not None:
                    await self._hints.gate(current)
                if retry_after_ms is not None and self._slots is not None:
                    self._slots.rate_due(current.queue, retry_after_ms)  # worker.rate_pump
                return Decision(DriveOutcome.AT_LIMIT)
            case RowLocked(current=current):
                # Another transaction holds the row (a claim in flight elsewhere, or its
                # producer's lock): a batch went on without it, a claim of it alone gave up
                # after worker_lock_wait_ms. Set aside: nothing is journaled (the journal's
                # insert would wait on the same row); a claimer that commits journals its
                # own activation; a run still runnable once its row is free is woken by
                # the sweeps (lost wakes, runnable suspended, released).
                hostile.rate_limited(
                    log, logging.INFO, "run.set_aside", run_id=current.id, write="claim"
                )
                return Decision(DriveOutcome.ROW_LOCKED)
            case NotFound():
                return Decision(DriveOutcome.NOT_FOUND)

    async def _took_slot(self, named: RunRow, activated: RunRow) -> Flow | None:
        """A higher-priority run took the slot ``named``'s delivery offered (docs/how-to/queues.md):
        ``named`` is still pending and its wake was used, so it gets a new one on its
        queue's recovery lane, read before the backlog, so it keeps its place at the head
        of its priority (a hint; the lost-wake sweep backs it up). The activated run's
        flow is one this process runs: the claim looked ahead only among those."""
        log.info(
            "run.ahead",
            extra={"run_id": activated.id, "ahead_of": named.id, "priority": activated.priority},
        )
        if self._hints is not None:
            await self._hints.hint_front(named)
        return self._flow(activated)

    def _wakeable(self, row: RunRow) -> bool:
        waiting = row.waiting
        assert waiting is not None
        if row.cancel_requested_at_ms is not None:
            return True  # a cancel closes any parked run, quarantined ones included
        match waiting.reason:
            case WaitingReason.RELEASED:
                return True
            case WaitingReason.QUARANTINE | WaitingReason.DEAD:
                return False  # otherwise only an operator's explicit resume moves it
            case (
                WaitingReason.TIMER
                | WaitingReason.QUOTA
                | WaitingReason.EVENT
                | WaitingReason.APPROVAL
                | WaitingReason.CHILD
            ):
                # Timers and quotas wake when due; the others when their timeout is.
                return waiting.wake_at_ms is not None and waiting.wake_at_ms <= row.now_ms
            case _:
                assert_never(waiting.reason)
