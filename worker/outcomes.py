"""The words a drive answers with, and the decision that carries them, as types.

``DriveOutcome`` is a StrEnum: its values are the stable strings the metrics label
carries, and mypy proves every ``match`` over it handles every case. Why a run stops
executing (``Cause``) is the flow's side of it: ``worker.authoring.durable``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runfleet.store.types import RunRow
    from runfleet.worker.authoring.flows import Flow


class DriveOutcome(enum.StrEnum):
    """What one ``Driver.drive`` did (also the ``runfleet_claim_outcomes`` label)."""

    ACTIVATED = "activated"
    """Claimed and activated here: the body runs in this process."""
    STOLEN = "stolen"
    """A stale owner's run taken over with evidence: the body resumes here."""
    NOT_FOUND = "not_found"
    TERMINAL = "terminal"
    """Already settled: nothing to do."""
    ALREADY_OWNED = "already_owned"
    """This process executes it already."""
    LEASE_CLOSED = "lease_closed"
    """This process's lease may have lapsed: it claims nothing until a renewal is confirmed."""
    STOPPING = "stopping"
    """This worker is stopping: it claims nothing, and hands the run's wake back to the fleet."""
    UNKNOWN_FLOW = "unknown_flow"
    """No flow of that name runs here: left for a worker that has it."""
    NOT_SERVED = "not_served"
    """The run's queue (its row's, whatever a message said) is not one this worker serves:
    left for that queue's workers, with a wake on its own queue's stream."""
    WAITING = "waiting"
    """Parked and not yet due: its wake moves it."""
    AT_LIMIT = "at_limit"
    """Its queue runs as many as its fleet-wide concurrency allows: gated until a slot frees."""
    CLAIM_LOST = "claim_lost"
    """Someone else changed the row first (journaled as evidence)."""
    ROW_LOCKED = "row_locked"
    """A batch claim skipped the row, held by another transaction (a claim in flight
    elsewhere, or its producer's ``SELECT ... FOR UPDATE``): not waited on; the lost-wake
    sweep brings it back."""
    CLAIM_PENDING = "claim_pending"
    """Another claimant's claim is recent: left to it."""
    CLAIMANT_ALIVE = "claimant_alive"
    """A stale claim whose claimant the probe vouched for."""
    CLAIM_RECOVERED = "claim_recovered"
    """A dead claimant's claim cleared (the run is claimable again)."""
    HEARTBEAT_FRESH = "heartbeat_fresh"
    """Its owner renewed recently: a live owner keeps its run."""
    STEAL_BACKOFF = "steal_backoff"
    """A vouched-for owner's lease is not probed again yet (the refusal ladder)."""
    STEAL_REFUSED_OWNER_ALIVE = "steal_refused_owner_alive"
    """Stale by the database clock, but the probe vouched for its owner: not taken."""
    ACTIVATION_LOST = "activation_lost"
    """A steal lost to a change made meanwhile (journaled as evidence)."""
    DEAD_LETTERED = "dead_lettered"
    """A stale run already recovered ``max_recoveries`` times in a row after lost processes:
    parked ``dead`` for an operator instead of taken over (journaled ``dead-lettered``)."""


@dataclass(frozen=True, slots=True)
class Activation:
    """A run this process now owns at a new epoch, and the flow that executes it (None: a
    run whose cancel was asked and whose flow does not run here; it is closed, not run)."""

    row: RunRow
    flow: Flow | None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the decide half (``worker.decisions.Decider``) answered for one run: the
    outcome word, and the activation the driver executes when the run was claimed or
    stolen here (``Driver.run_decided``)."""

    outcome: DriveOutcome
    activation: Activation | None = None

    @classmethod
    def activated(cls, outcome: DriveOutcome, row: RunRow, flow: Flow | None) -> Decision:
        return cls(outcome, Activation(row, flow))
