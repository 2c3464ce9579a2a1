"""What a run waits on: deferred completions, the answers to its events, and clocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from runfleet.store.types.outcomes import NotFound
from runfleet.store.types.run import JsonValue, RunStatus

TIMED_OUT = "timed_out"
"""The metadata key of the deferred a wait's own timeout writes (``Deferreds.time_out``)."""


@dataclass(frozen=True, slots=True)
class DeferredRow:
    run_id: str
    name: str
    value: JsonValue
    metadata: JsonValue
    completed_at_ms: int
    consumed_at_ms: int | None
    digest: str | None = None
    """The stored value's digest (``runfleet.value_digest``, migration 0014: sha256 of its
    exact text); None on rows written before it."""

    @property
    def timed_out(self) -> bool:
        """Whether this is a wait's own timeout, not an answer (``Deferreds.time_out``)."""
        return isinstance(self.metadata, dict) and self.metadata.get(TIMED_OUT) is True


@dataclass(frozen=True, slots=True)
class DeferredCompleted:
    row: DeferredRow


@dataclass(frozen=True, slots=True)
class DeferredExisting:
    """Another completion won first (first writer wins); nothing was written.

    ``same``: the value that stands has the offered value's digest (a retry whose first
    try committed unseen, or an identical completion); never for a wait's timeout.
    """

    row: DeferredRow
    same: bool


@dataclass(frozen=True, slots=True)
class EventCompleted:
    """This answer completed the event (first writer): it is the value the flow reads."""

    run_id: str
    name: str
    digest: str | None
    woke: bool

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class EventExisting:
    """An earlier answer completed the event; this one wrote nothing (first writer wins).

    ``same`` True: the value that stands has this answer's digest, so the flow reads this
    value anyway (a retry whose first try committed but whose reply was lost, or an
    identical answer from someone else). False: another value won. ``digest`` is the
    winner's (None if it was written before migration 0014).
    """

    run_id: str
    name: str
    digest: str | None
    same: bool

    def __bool__(self) -> bool:
        return self.same


@dataclass(frozen=True, slots=True)
class EventTimedOut:
    """The wait's timeout came first (it is durable): this answer wrote nothing."""

    run_id: str
    name: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class EventRunSettled:
    """The run has settled and takes nothing: no deferred, no wake, no journal record."""

    run_id: str
    status: RunStatus

    def __bool__(self) -> bool:
        return False


EventAnswer: TypeAlias = EventCompleted | EventExisting | EventTimedOut | EventRunSettled
"""What ``complete`` (an answer to ``ctx.wait_for``) did. True (``bool``) exactly when the
event now holds the value offered: ``EventCompleted``, or ``EventExisting(same=True)``."""


@dataclass(frozen=True, slots=True)
class ClockRow:
    run_id: str
    name: str
    deferred_name: str
    due_at_ms: int
    completed_at_ms: int | None


@dataclass(frozen=True, slots=True)
class ClockScheduled:
    row: ClockRow


@dataclass(frozen=True, slots=True)
class ClockExisting:
    row: ClockRow


@dataclass(frozen=True, slots=True)
class ClockCompleted:
    row: ClockRow


@dataclass(frozen=True, slots=True)
class ClockAlreadyCompleted:
    row: ClockRow


@dataclass(frozen=True, slots=True)
class ClockFiring:
    """What firing a clock did (``Waits.complete_clock``)."""

    outcome: ClockCompleted | ClockAlreadyCompleted | NotFound
    woke: bool
    """The run's wait was cleared by it: send the run a wake."""
