"""What each compare-and-swap answers: one frozen dataclass per outcome, so callers
``match`` on them; a lost race is an ordinary answer, never an exception.

Admission (``Created``/``Joined``), claim, activate and steal, settlement
(``Transitioned``, ``GuardFailed``, ``NotOwner``), cancel, park and wake, and the lease's
renewal (``Heartbeat``, ``Reconfirmation``); each family's union is a ``…Outcome`` alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from runfleet.store.types.run import JsonValue, Owner, RunRow, RunStatus, WaitingRow

if TYPE_CHECKING:  # store.journal_records builds on store.types.run: for annotations only
    import runfleet.store.journal_records as jr


@dataclass(frozen=True, slots=True)
class Created:
    row: RunRow


@dataclass(frozen=True, slots=True)
class Joined:
    """The id already named an identical run: the caller joins it."""

    row: RunRow


@dataclass(frozen=True, slots=True)
class Claimed:
    row: RunRow


@dataclass(frozen=True, slots=True)
class Activated:
    row: RunRow


@dataclass(frozen=True, slots=True)
class ClaimRecovered:
    row: RunRow


@dataclass(frozen=True, slots=True)
class Stolen:
    row: RunRow
    previous: Owner


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A steal found the run re-activated ``max_recoveries`` times in a row after lost
    processes: it is parked ``dead`` (suspended, no owner) instead of stolen again."""

    row: RunRow
    previous: Owner
    evidence: dict[str, JsonValue]
    """What the park recorded (``waiting.request``): recoveries, the limit, the owners lost."""


@dataclass(frozen=True, slots=True)
class SnapshotChanged:
    current: RunRow


@dataclass(frozen=True, slots=True)
class NotServed:
    """The run's queue is not one the claimant serves: nothing changed.

    Which pool executes a run is the row's decision (its ``queue``), never a message's:
    a run is claimed, activated or stolen only by a worker serving its queue.
    """

    current: RunRow


@dataclass(frozen=True, slots=True)
class AtLimit:
    """The run's queue has as many runs executing as its fleet-wide concurrency allows, or
    its rate has no token (docs/how-to/queues.md): nothing changed; the run starts when a slot
    frees or, for a rate, after ``retry_after_ms``."""

    current: RunRow
    retry_after_ms: int | None = None
    """When the queue's rate next allows a start (None: the queue has no rate)."""


@dataclass(frozen=True, slots=True)
class LeaseFresh:
    """A steal was refused by the database clock: the owner renewed recently."""

    current: RunRow


@dataclass(frozen=True, slots=True)
class NotFound:
    run_id: str


@dataclass(frozen=True, slots=True)
class Transitioned:
    """``cascaded``: descendants a terminal settlement asked to cancel (each closes through
    its own cancel path); ``woke``: parents whose wait on this run it cleared."""

    row: RunRow
    cascaded: tuple[str, ...] = ()
    woke: tuple[RunRow, ...] = ()
    """The woken parents as the waking statement left them (no second read to hint them)."""


@dataclass(frozen=True, slots=True)
class Settle:
    """One terminal settlement (completed, failed or cancelled) a batch commits.

    ``Lifecycle.settle_many`` applies each with ``transition_owned``'s rules: fenced by
    the owner and ``epoch``, cancel-guarded when ``guard``, its own journal record:
    ``record`` (``store.settlements`` builds each ending's), a plain ``transitioned``
    when None. The store stamps the record's ``to`` and ``epoch`` with the item's
    (``store.settlements.journaled``).
    """

    run_id: str
    epoch: int
    status: RunStatus
    patch: dict[str, JsonValue]
    record: jr.Settled | None = None
    guard: bool = True


@dataclass(frozen=True, slots=True)
class CheckedSettle:
    """A ``Settle`` whose values are encoded and known storable (``Lifecycle.check``).

    What ``Lifecycle.settle_many`` sends for it, computed once: the canonical JSON texts of
    the state patch (its ``result`` taken out), of the result and of the journal record's
    payload, and that payload's digest. A caller that checks each item before batching it
    (``worker.settle``) hands the batch these, so nothing is encoded twice.
    """

    item: Settle
    record: jr.Settled
    patch: str
    result: str | None
    payload: str
    digest: str


@dataclass(frozen=True, slots=True)
class GuardFailed:
    """A cancel request landed first; the caller must cancel instead of settling."""

    current: RunRow


@dataclass(frozen=True, slots=True)
class NotOwner:
    current: RunRow


@dataclass(frozen=True, slots=True)
class RowLocked:
    """Another transaction held the run's row locked (its producer may hold it ``FOR
    UPDATE``; another worker may be writing it): a batch statement left the run out, or a
    statement on this run alone gave up waiting after ``Settings.worker_lock_wait_ms``
    (``store.db.LockWaitEnded``). Nothing was written; the run is set aside and tried
    again later. A batch settlement's: still ours at its epoch, no cancel asked; the
    caller settles it alone. A claim's: the row as read, unchanged (a batch's on a
    limited queue reads as ``AtLimit``, its wake gated). A steal's, a lone settlement's,
    a release's: the row as it is now, read without a lock."""

    current: RunRow


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """``row`` is the round the request reached (the live one when the id handed off);
    ``rounds`` every round it reached; ``cascaded`` the attached descendants asked too."""

    row: RunRow
    rounds: tuple[str, ...] = ()
    cascaded: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AlreadyRequested:
    row: RunRow


@dataclass(frozen=True, slots=True)
class AlreadyTerminal:
    row: RunRow


@dataclass(frozen=True, slots=True)
class Parked:
    row: WaitingRow


@dataclass(frozen=True, slots=True)
class AlreadySatisfied:
    """The deferred a park waits on completed first: the run keeps running."""

    deferred_name: str


@dataclass(frozen=True, slots=True)
class Woken:
    row: WaitingRow


@dataclass(frozen=True, slots=True)
class NotWaiting:
    run_id: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One renewal round: runs still fenced to us, cancel requests among them, db time."""

    confirmed: frozenset[str]
    cancel_requested: frozenset[str]
    now_ms: int
    reconfirmed: frozenset[str] = frozenset()
    """Runs this renewal journaled ``lease-reconfirmed`` on (a ``Reconfirmation``'s)."""
    skipped: frozenset[str] = frozenset()
    """Runs still ours whose rows another transaction held locked: not renewed this beat
    (the statement skips locked rows rather than wait), not lost either."""


@dataclass(frozen=True, slots=True)
class Reconfirmation:
    """A renewal sent after a lapse: journal ``lease-reconfirmed`` on each run it renews.

    Only where the process still holds the run at the epoch it executes it at (fenced in
    the renewal statement itself), with how long the lease had gone unconfirmed.
    """

    epochs: Mapping[str, int]
    """Run id -> the epoch this process holds it at."""
    unconfirmed_ms: int
    """Milliseconds from the send of the newest confirmed renewal to this one's."""


CreateOutcome: TypeAlias = Created | Joined
ClaimOutcome: TypeAlias = Claimed | SnapshotChanged | NotServed | NotFound
ActivateOutcome: TypeAlias = (
    Activated | SnapshotChanged | NotServed | AtLimit | RowLocked | NotFound
)
StealOutcome: TypeAlias = (
    Stolen | DeadLettered | SnapshotChanged | LeaseFresh | NotServed | RowLocked | NotFound
)
TransitionOutcome: TypeAlias = Transitioned | GuardFailed | NotOwner | NotFound
CancelOutcome: TypeAlias = CancelRequested | AlreadyRequested | AlreadyTerminal | NotFound
ParkOutcome: TypeAlias = Parked | AlreadySatisfied | GuardFailed | NotOwner | NotFound
WakeOutcome: TypeAlias = Woken | NotWaiting | NotFound
