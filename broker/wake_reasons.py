"""Why a wake was published: the ``reason`` a stream message carries (``broker.codec``).

Operators read it in the stream (``XRANGE``) and in traces; nothing decides by it. The
wire keeps it a string (a newer worker's reason must still decode), so only the writers
use this type.
"""

from __future__ import annotations

import enum

from runfleet.store.sweeps import SweepKind


class WakeReason(enum.StrEnum):
    ENQUEUE = "enqueue"
    """A producer admitted the run."""
    SCHEDULE = "schedule"
    """A schedule or a delayed run came due (the outbox, the scheduler)."""
    DISPLACED = "displaced"
    """A higher-priority run took the slot its wake was for: the wake is published again."""
    SLOT = "slot"
    """A slot of its queue freed (fleet-wide concurrency or rate) and opened the gate."""
    MESSAGE = "message"
    """A message was sent to the run."""
    CANCEL = "cancel"
    """A cancel was requested."""
    EVENT = "event"
    """An event it waits on was answered."""
    APPROVAL = "approval"
    """Its approval was answered."""
    RESUME = "resume"
    """An operator resumed it (quarantine, dead)."""
    SWEEP_PARKED = "sweep:parked"
    SWEEP_STALE_RUNNING = "sweep:stale_running"
    SWEEP_DUE_CLOCKS = "sweep:due_clocks"
    SWEEP_PENDING_CANCELLATIONS = "sweep:pending_cancellations"
    SWEEP_LOST_PENDING = "sweep:lost_pending"
    SWEEP_DUE_WAITS = "sweep:due_waits"
    SWEEP_DEADLINE_PASSED = "sweep:deadline_passed"
    SWEEP_RUNNABLE_SUSPENDED = "sweep:runnable_suspended"

    @classmethod
    def of_sweep(cls, kind: SweepKind) -> WakeReason:
        """The reason a sweep of ``kind`` publishes its finds with."""
        return cls(f"sweep:{kind.label}")
