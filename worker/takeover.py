"""Taking over a run another process holds: the steal of a stale lease and the recovery of a
stranded claim, each decided by database time and a liveness probe, with the evidence
journaled (once per lease, observer, evidence and witness) whether the takeover happens or not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import runfleet.worker.metrics as metrics
from runfleet.broker.liveness import Probe
from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.types import (
    ClaimRecovered,
    DeadLettered,
    LeaseFresh,
    NotFound,
    NotServed,
    Owner,
    RowLocked,
    RunRow,
    SnapshotChanged,
    Stolen,
)
from runfleet.worker.authoring.flows import NEVER, Flow
from runfleet.worker.evidence import RefusalLadder, journal_evidence
from runfleet.worker.outcomes import Decision, DriveOutcome

log = logging.getLogger("runfleet.worker.takeover")

ProbeFn = Callable[[Owner, int | None], Awaitable[Probe]]
"""(owner, the row's last heartbeat or claim time in database ms) -> what vouches for it."""
UNKNOWN_PROBE = Probe(verdict="unknown", evidence="lease-expired")


class Takeover:
    def __init__(
        self, store: Store, owner: Owner, settings: Settings, probe: ProbeFn | None
    ) -> None:
        self._store = store
        self._owner = owner
        self._settings = settings
        self._probe = probe
        self.ladder = RefusalLadder.for_settings(settings)
        """Per (run, lease): when a vouched-for owner is probed again."""

    async def stranded_claim(self, row: RunRow) -> DriveOutcome:
        """A claim nobody activated: left while recent or vouched for, else cleared."""
        assert row.claim is not None and row.claimed_at_ms is not None
        if row.now_ms - row.claimed_at_ms <= self._settings.stale_after_ms:
            return DriveOutcome.CLAIM_PENDING
        probe = await self._probe_owner(row.claim, row.claimed_at_ms)
        if probe.vouches:
            return DriveOutcome.CLAIMANT_ALIVE
        match await self._store.runs.recover_claim(
            row.id,
            row.claim,
            row.claimed_at_ms,
            jr.ProbeEvidence(probe=probe.evidence, probe_detail=dict(probe.detail)),
        ):
            case ClaimRecovered():
                return DriveOutcome.CLAIM_RECOVERED
            case _:
                return DriveOutcome.CLAIM_LOST

    async def steal(self, row: RunRow, flow: Flow | None) -> Decision:
        """A running row no drive of this process holds: take it over if its lease is stale
        by database time and no witness vouches for its owner, journaling the evidence."""
        owner, heartbeat = row.owner, row.heartbeat_at_ms
        assert owner is not None and heartbeat is not None
        if row.now_ms - heartbeat <= self._settings.stale_after_ms:
            if owner != self._owner:
                # The lease alone refuses (no probe is asked), journaled once per lease
                # so an operator whose wake did nothing sees a live owner was in the way.
                await self.refused(row.id, owner, heartbeat, jr.RefusalEvidence.LEASE_FRESH)
            return Decision(DriveOutcome.HEARTBEAT_FRESH)
        if owner == self._owner:
            # Ours, but no drive holds it (its settlement or release gave up after an
            # outage): nobody renews it, and every other worker's probe vouches for us.
            # Take it back through the same fenced steal, with the epoch bumped.
            probe = Probe(verdict="dead", evidence="self-orphaned", detail={"pid": owner.pid})
        elif not self.ladder.due(row.id, heartbeat):
            return Decision(DriveOutcome.STEAL_BACKOFF)
        else:
            probe = await self._probe_owner(owner, heartbeat)
        if probe.vouches:
            self.ladder.refused(row.id, heartbeat)
            await self.refused(
                row.id, owner, heartbeat, jr.RefusalEvidence.PROBE, probe=probe.evidence
            )
            return Decision(DriveOutcome.STEAL_REFUSED_OWNER_ALIVE)
        evidence = jr.ProbeEvidence(
            probe=probe.evidence, observer=self._owner.key, probe_detail=dict(probe.detail)
        )
        # Taking back a run this process orphaned is not a lost process: it never counts
        # toward the run's recoveries in a row (a poison run's walk through the fleet).
        counted = probe.evidence != "self-orphaned"
        limit = None if flow is None else flow.max_recoveries  # the flow's own, if it says
        stealing = self._store.runs.steal(
            row.id,
            row.snapshot,
            self._owner,
            evidence,
            counted=counted,
            max_recoveries=limit if isinstance(limit, int) else None,
            dead_letter=limit != NEVER,
        )
        match await stealing:
            case DeadLettered(evidence=dead):
                self.ladder.forget(row.id)
                metrics.DEAD_LETTERED.inc()
                log.error(
                    "run.dead_lettered",
                    extra={
                        "run_id": row.id,
                        "previous": owner.key,
                        "recoveries": dead.get("recoveries"),
                        "lost_owners": dead.get("lost_owners"),
                    },
                )
                return Decision(DriveOutcome.DEAD_LETTERED)
            case Stolen(row=stolen):
                self.ladder.forget(row.id)
                metrics.STEALS.labels(probe.evidence).inc()
                log.info(
                    "run.stolen",
                    extra={"run_id": row.id, "previous": owner.key, "evidence": probe.evidence},
                )
                return Decision.activated(DriveOutcome.STOLEN, stolen, flow)
            case LeaseFresh(current=current):
                await self.refused(
                    row.id, owner, current.heartbeat_at_ms, jr.RefusalEvidence.LEASE_FRESH
                )
                return Decision(DriveOutcome.HEARTBEAT_FRESH)
            case SnapshotChanged(current=current):
                await journal_evidence(
                    self._store,
                    row.id,
                    owner,
                    heartbeat,
                    jr.ActivationLost(
                        observer=self._owner.key,
                        outcome=jr.LostOutcome.SNAPSHOT_CHANGED,
                        expected_epoch=row.epoch,
                    ),
                )
                return Decision(DriveOutcome.ACTIVATION_LOST)
            case RowLocked():
                # Another transaction holds the row past worker_lock_wait_ms (its producer
                # may lock its own run): set aside, nothing written; the stale sweep finds
                # it again once a later tick comes round to it.
                log.info("run.set_aside", extra={"run_id": row.id, "write": "steal"})
                return Decision(DriveOutcome.ROW_LOCKED)
            case NotServed():
                return Decision(DriveOutcome.NOT_SERVED)  # the driver checks first: not reached
            case NotFound():
                return Decision(DriveOutcome.NOT_FOUND)

    async def refused(
        self,
        run_id: str,
        owner: Owner,
        heartbeat_at_ms: int | None,
        evidence: jr.RefusalEvidence,
        *,
        probe: str | None = None,
    ) -> None:
        """Journal a refused takeover once per (run, owner, lease, evidence, observer, probe)."""
        payload = jr.StealRefusedOwnerAlive(
            evidence=evidence,
            observer=self._owner.key,
            heartbeat_at_ms=heartbeat_at_ms,
            probe=probe,
        )
        await journal_evidence(self._store, run_id, owner, heartbeat_at_ms, payload)

    async def _probe_owner(self, owner: Owner, heartbeat_at_ms: int) -> Probe:
        """The probe's answer for ``owner``'s lease last confirmed at ``heartbeat_at_ms``."""
        if self._probe is None:
            return UNKNOWN_PROBE
        try:
            return await self._probe(owner, heartbeat_at_ms)
        except Exception:  # the probe is a witness, not a judge: no answer is "unknown"
            log.exception("probe.failed", extra={"owner": owner.key})
            return UNKNOWN_PROBE
