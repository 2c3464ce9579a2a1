"""Typed rows and outcomes that cross the store boundary.

Every compare-and-swap answers with one frozen dataclass per outcome so callers
``match`` on them; a lost race is an ordinary answer, never an exception.
"""

from __future__ import annotations

import enum
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

JsonValue: TypeAlias = Any
"""A value that round-trips through JSON (validated at the store boundary)."""


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class WaitingReason(enum.StrEnum):
    TIMER = "timer"
    EVENT = "event"
    APPROVAL = "approval"
    QUOTA = "quota"
    RELEASED = "released"
    QUARANTINE = "quarantine"
    CHILD = "child"
    DEAD = "dead"
    """A poison run: its executions kept ending in a lost process; only an operator's
    resume (or a cancel) moves it."""


class OnParentExit(enum.StrEnum):
    CANCEL = "cancel"
    DETACH = "detach"


class OnDuplicate(enum.StrEnum):
    """What admitting a ``dedup_key`` that an open run of the queue holds answers."""

    JOIN = "join"
    """The open run (``Joined``), as re-admitting its id would."""
    REFUSE = "refuse"
    """``DuplicateRun`` naming the open run."""


@dataclass(frozen=True, slots=True)
class Owner:
    """A worker process: equal only when host, pid and the per-start nonce all match."""

    host_id: str
    pid: int
    nonce: str

    @classmethod
    def for_this_process(cls, host_id: str) -> Owner:
        return cls(host_id=host_id, pid=os.getpid(), nonce=secrets.token_hex(6))

    @property
    def key(self) -> str:
        return f"{self.host_id}:{self.pid}:{self.nonce}"

    @classmethod
    def parse(cls, key: str | None) -> Owner | None:
        """The owner whose ``key`` this is (``host:pid:nonce``); None if it is not one.

        Split from the right: pid and nonce never contain ``:``, a host id might. The
        pid is ASCII digits of a plausible length (``"²".isdigit()`` is true).
        """
        parts = key.rsplit(":", 2) if key else []
        if len(parts) != 3 or not parts[0] or not parts[2]:
            return None
        host, pid, nonce = parts
        if not (pid.isascii() and pid.isdigit()) or len(pid) > 10:
            return None
        return cls(host_id=host, pid=int(pid), nonce=nonce)

    def __str__(self) -> str:
        return f"{self.host_id} pid {self.pid} ({self.nonce})"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a claimant read: any change to these fields since then makes its CAS lose."""

    status: RunStatus
    owner: Owner | None
    heartbeat_at_ms: int | None
    claim: Owner | None
    epoch: int | None = None
    """The tenure the caller read; a suspended row looks alike across tenures without it."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A park's declaration: why the run waits, until when, and what it asked."""

    reason: WaitingReason
    wake_at_ms: int | None = None
    token: str | None = None
    request: JsonValue = None


@dataclass(frozen=True, slots=True)
class WaitingRow:
    run_id: str
    reason: WaitingReason
    wake_at_ms: int | None
    token: str | None
    request: JsonValue
    depth: int = 0


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    flow: str
    queue: str
    status: RunStatus
    state: dict[str, JsonValue]
    owner: Owner | None
    epoch: int
    heartbeat_at_ms: int | None
    claim: Owner | None
    claimed_at_ms: int | None
    cancel_requested_at_ms: int | None
    lineage_id: str
    round_ordinal: int
    parent_run_id: str | None
    created_at_ms: int
    updated_at_ms: int
    waiting: Waiting | None
    now_ms: int = 0
    """Database time when this row was read (for lease-age arithmetic)."""
    recoveries: int = 0
    """Takeovers in a row that re-activated the run after its process was lost; at
    ``Settings.max_recoveries`` the next one parks it ``dead`` instead (migration 0012)."""
    priority: int = 0
    """Higher starts first within its queue, with aging (docs/queues.md)."""
    dedup_key: str | None = None
    """At most one open run of the queue holds it (docs/queues.md)."""
    concurrency_key: str | None = None
    """Its fairness key, from its flow's key expression at admission (docs/queues.md)."""
    limited: bool = False
    """Its queue has a fleet-wide concurrency limit (as the claim that returned it saw)."""

    @property
    def snapshot(self) -> Snapshot:
        return Snapshot(self.status, self.owner, self.heartbeat_at_ms, self.claim, self.epoch)

    @property
    def payload(self) -> JsonValue:
        return self.state.get("payload")

    @property
    def scopes(self) -> tuple[str, ...]:
        return tuple(self.state.get("scopes") or ())

    @property
    def result(self) -> JsonValue:
        return self.state.get("result")

    @property
    def on_parent_exit(self) -> OnParentExit:
        return OnParentExit(self.state.get("on_parent_exit") or OnParentExit.CANCEL)

    # The keys of ``state`` read outside the store, one typed reader each, so no
    # module spells ``state["key"]``. State is JSON the store wrote: absent is None.

    @property
    def error(self) -> JsonValue:
        """How a failed run failed (``{"type", "message", "traceback"}`` from the worker)."""
        return self.state.get("error")

    @property
    def cancellation(self) -> JsonValue:
        """What the cancelling owner recorded (``acknowledged_by``, compensated steps)."""
        return self.state.get("cancellation")

    @property
    def parent(self) -> str | None:
        """The run that admitted this one as a child (``NewRun.parent_id``)."""
        return _str_or_none(self.state.get("parent"))

    @property
    def handed_off_to(self) -> str | None:
        """The next round of the lineage, once this round handed off."""
        return _str_or_none(self.state.get("handed_off_to"))

    @property
    def requeued_as(self) -> str | None:
        """The round that replaced this failed one (rq's requeue)."""
        return _str_or_none(self.state.get("requeued_as"))

    @property
    def deadline_ms(self) -> int | None:
        """Database time past which the run is cancelled (``deadline``/``timeout``)."""
        return _int_or_none(self.state.get("deadline_ms"))

    @property
    def max_rounds(self) -> int | None:
        """The lineage's round budget, recorded by its first round and copied by each."""
        return _int_or_none(self.state.get("max_rounds"))

    @property
    def depends_on(self) -> tuple[str, ...]:
        """Run ids an rq-style job waits for before it starts."""
        ids = self.state.get("depends_on")
        return tuple(str(i) for i in ids) if isinstance(ids, list) else ()

    @property
    def meta(self) -> dict[str, JsonValue]:
        """rq's ``job.meta`` (a copy: the row is immutable)."""
        meta = self.state.get("meta")
        return dict(meta) if isinstance(meta, dict) else {}

    @property
    def func_name(self) -> str | None:
        """rq's ``module.function`` name, when the producer gave one."""
        name = self.state.get("func_name")
        return str(name) if name else None

    @property
    def description(self) -> str | None:
        """rq's ``job.description``, when the producer gave one."""
        given = self.state.get("description")
        return str(given) if given else None


def _str_or_none(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: JsonValue) -> int | None:
    return int(value) if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class NewRun:
    """An admission request. ``id`` doubles as the idempotency key."""

    id: str
    flow: str
    queue: str = "default"
    payload: JsonValue = None
    scopes: tuple[str, ...] = ()
    parent_id: str | None = None
    """The run that admitted this one as a child (a DAG edge is recorded)."""
    on_parent_exit: OnParentExit = OnParentExit.CANCEL
    lineage_id: str | None = None
    previous_round_id: str | None = None
    """The round this one continues (handoff chain); stored as ``parent_run_id``."""
    round_ordinal: int = 0
    max_rounds: int | None = None
    deadline_ms: int | None = None
    """Database time past which the run is cancelled; with ``timeout_ms`` too, the earlier
    of the two wins. An attached child's is also bounded by its parent's (``store.admit``)."""
    delay_until_ms: int | None = None
    timeout_ms: int | None = None
    """Deadline relative to admission, on the database clock (``@flow(timeout=...)``)."""
    extra: dict[str, JsonValue] = field(default_factory=dict)
    priority: int | None = None
    """Higher starts first within the queue (docs/queues.md); None: the queue's default."""
    dedup_key: str | None = None
    """While a run of the queue with this key is open, admission answers that run
    (``on_duplicate``): unlike the run id, the key is free again once the run settles."""
    on_duplicate: OnDuplicate = field(default_factory=lambda: OnDuplicate.JOIN)


@dataclass(frozen=True, slots=True)
class JournalRecord:
    seq: int
    run_id: str
    kind: str
    source_id: str
    source_seq: int
    payload: JsonValue
    at_ms: int


# ---- outcomes --------------------------------------------------------------


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
    its rate has no token (docs/queues.md): nothing changed; the run starts when a slot
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
    the owner and ``epoch``, cancel-guarded when ``guard``, its own journal record.
    """

    run_id: str
    epoch: int
    status: RunStatus
    patch: dict[str, JsonValue]
    kind: str = "transitioned"
    record: dict[str, JsonValue] | None = None
    guard: bool = True


@dataclass(frozen=True, slots=True)
class GuardFailed:
    """A cancel request landed first; the caller must cancel instead of settling."""

    current: RunRow


@dataclass(frozen=True, slots=True)
class NotOwner:
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


@dataclass(frozen=True, slots=True)
class PendingCursor:
    run_id: str
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class Accepted:
    seq: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    seq: int


@dataclass(frozen=True, slots=True)
class Conflict:
    seq: int
    existing_payload: JsonValue


EmitOutcome: TypeAlias = Accepted | Duplicate | Conflict
CreateOutcome: TypeAlias = Created | Joined
ClaimOutcome: TypeAlias = Claimed | SnapshotChanged | NotServed | NotFound
ActivateOutcome: TypeAlias = Activated | SnapshotChanged | NotServed | AtLimit | NotFound
StealOutcome: TypeAlias = (
    Stolen | DeadLettered | SnapshotChanged | LeaseFresh | NotServed | NotFound
)
TransitionOutcome: TypeAlias = Transitioned | GuardFailed | NotOwner | NotFound
CancelOutcome: TypeAlias = CancelRequested | AlreadyRequested | AlreadyTerminal | NotFound
ParkOutcome: TypeAlias = Parked | AlreadySatisfied | GuardFailed | NotOwner | NotFound
WakeOutcome: TypeAlias = Woken | NotWaiting | NotFound


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


@dataclass(frozen=True, slots=True)
class ParentEdge:
    child_id: str
    parent_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class EdgeRecorded:
    edge: ParentEdge


@dataclass(frozen=True, slots=True)
class EdgeExisting:
    edge: ParentEdge


def canonical_json(value: JsonValue) -> str:
    """Key-order-independent JSON text: the identity used for payload comparison and digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
