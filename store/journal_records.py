"""The journal's words as types: its record kinds and one frozen payload type per kind.

Writers (store and worker) build a payload type and store its ``dump()``; readers
(``ops/explain``, ``runfleet journal``, the dashboard) ``decode`` a stored record back
into one. The stored JSON is the contract (docs/reference/journal.md): the keys and
values written here are the ones earlier versions wrote, so a record's digest and the
``--json`` views do not change with this module.

Decoding is a boundary. A record written by an older or a newer version, by hand, or by
someone hostile still decodes: a field of the wrong type reads as absent (its default), a
field this version does not know is kept in ``extra``, a kind it does not know is an
``UnknownPayload`` — never an exception, because an audit trail must stay readable
through a rolling deploy.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeAlias, Union, assert_never

from runfleet.store.types.run import RunStatus, WaitingReason


class Kind(enum.StrEnum):
    """Journal record kinds (stable strings: operators and tools read them)."""

    CREATED = "created"
    PARENT_RECORDED = "parent-recorded"
    CLAIMED_AND_ACTIVATED = "claimed-and-activated"
    CLAIMED = "claimed"
    ACTIVATED = "activated"
    STOLEN_AND_ACTIVATED = "stolen-and-activated"
    CLAIM_RECOVERED = "claim-recovered"
    CLAIM_ABANDONED = "claim-abandoned"
    CLAIM_LOST = "claim-lost"
    ACTIVATION_LOST = "activation-lost"
    STEAL_REFUSED_OWNER_ALIVE = "steal-refused-owner-alive"
    RESUMED = "resumed"
    TRANSITIONED = "transitioned"
    PARKED = "parked"
    WOKEN = "woken"
    INTERRUPT_RELEASED = "interrupt-released"
    CANCEL_REQUESTED = "cancel-requested"
    INTERRUPTED = "interrupted"
    HANDED_OFF = "handed-off"
    LINEAGE_EXHAUSTED = "lineage-exhausted"
    ROUND_INVALID = "round-invalid"
    WAKE_SCHEDULED = "wake-scheduled"
    """No writer today; kept so records of older versions still name their kind."""
    CHILD_POLICY_APPLIED = "child-policy-applied"
    QUARANTINED = "quarantined"
    DEAD_LETTERED = "dead-lettered"
    LEASE_RECONFIRMED = "lease-reconfirmed"
    DEFERRED_COMPLETED = "deferred-completed"
    CLOCK_FIRED = "clock-fired"
    STEP_RECORDED = "step-recorded"
    STEP_COMPENSATED = "step-compensated"
    STEP_COMPENSATION_FAILED = "step-compensation-failed"
    APPROVAL_APPROVED = "approval-approved"
    APPROVAL_DENIED = "approval-denied"
    EVENT_SET = "event-set"
    MESSAGE_SENT = "message-sent"
    MESSAGE_RECEIVED = "message-received"
    FORKED = "forked"
    RESUMED_AS = "resumed-as"
    FORKED_FROM = "history-copied"


class ReleaseCause(enum.StrEnum):
    """Why a run was handed back unsettled (``interrupt-released``'s ``cause``)."""

    LEASE_LAPSED = "lease-lapsed"
    """This process could not confirm its lease in time."""
    INTERRUPTED = "interrupted"
    """Shutdown, a failed drive, an outage: ``detail`` names which
    (``worker.authoring.durable.Cause``)."""


class CascadeCause(enum.StrEnum):
    """Why a run's attached descendants were asked to cancel (``child-policy-applied`` and
    the descendants' ``cancel-requested``): the parent's end, by its terminal status."""

    PARENT_COMPLETED = "parent-completed"
    PARENT_FAILED = "parent-failed"
    PARENT_CANCELLED = "parent-cancelled"


def cascade_cause(status: RunStatus) -> CascadeCause:
    """The cascade a parent's settlement in ``status`` starts."""
    match status:
        case RunStatus.COMPLETED:
            return CascadeCause.PARENT_COMPLETED
        case RunStatus.FAILED:
            return CascadeCause.PARENT_FAILED
        case RunStatus.CANCELLED:
            return CascadeCause.PARENT_CANCELLED
        case RunStatus.PENDING | RunStatus.RUNNING | RunStatus.SUSPENDED:
            raise ValueError(f"a {status} run has not ended: it cascades nothing")
        case _:
            assert_never(status)


class WakeCause(enum.StrEnum):
    """Who cleared a run's wait (``woken``'s ``cause``): a caller of ``Waits.wake``, or a
    driver that found the wait due (``driver:<waiting reason>``)."""

    WAKE = "wake"
    DRIVER_TIMER = "driver:timer"
    DRIVER_EVENT = "driver:event"
    DRIVER_APPROVAL = "driver:approval"
    DRIVER_QUOTA = "driver:quota"
    DRIVER_RELEASED = "driver:released"
    DRIVER_QUARANTINE = "driver:quarantine"
    DRIVER_CHILD = "driver:child"
    DRIVER_DEAD = "driver:dead"

    @classmethod
    def by_driver(cls, reason: WaitingReason) -> WakeCause:
        """The cause a driver journals for waking a wait of ``reason``."""
        return cls(f"driver:{reason.value}")


class RefusalEvidence(enum.StrEnum):
    """Why a takeover was refused (``steal-refused-owner-alive``'s ``evidence``)."""

    LEASE_FRESH = "lease-fresh"
    """The owner renewed its lease between the read and the steal."""
    PROBE = "probe"
    """The liveness probe vouched for the owner."""


class LostOutcome(enum.StrEnum):
    """What a lost takeover lost to (``activation-lost``'s ``outcome``)."""

    SNAPSHOT_CHANGED = "snapshot-changed"


class ResumedFrom(enum.StrEnum):
    """Which operator decision a ``resumed`` record is (its ``from``)."""

    QUARANTINE = "quarantine"
    DEAD = "dead"


# ---- the payload machinery -----------------------------------------------------------


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """A payload type's field types, resolved once (decoding a journal page reads many)."""
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def _fits(value: object, hint: object) -> bool:
    """Whether a decoded JSON value is of the field's declared type (a bool is no int)."""
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if hint is int:
        return type(value) is int
    if hint is float:
        return type(value) in (int, float)
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        return isinstance(value, str) and value in hint._value2member_map_
    if isinstance(hint, type):
        return isinstance(value, hint)
    return False  # pragma: no cover - every field above is one of these


def _convert(value: object, hint: object) -> object:
    """A fitting value as the field holds it: a StrEnum member for its string."""
    for arm in typing.get_args(hint) or (hint,):
        if isinstance(arm, type) and issubclass(arm, enum.StrEnum) and isinstance(value, str):
            if value in arm._value2member_map_:
                return arm(value)
    return value


_DUMPED: dict[type[Any], tuple[tuple[str, str, bool], ...]] = {}


def _dumped_fields(cls: type[Payload]) -> tuple[tuple[str, str, bool], ...]:
    """(field, JSON key, left out when None) of each field a kind's ``dump`` writes, in
    declaration order: read once per kind (``dataclasses.fields`` on every record was a
    measurable share of a settlement's CPU)."""
    found = _DUMPED.get(cls)
    if found is None:
        found = _DUMPED[cls] = tuple(
            (f.name, cls._key(f.name), f.name in cls.OMIT_NONE)
            for f in dataclasses.fields(cls)
            if f.name != "extra"
        )
    return found


@dataclass(frozen=True, kw_only=True)
class Payload:
    """One kind's payload. ``extra``: the fields of a stored record this version does not
    know (a newer writer's), kept for views; ``dump`` never writes them."""

    KIND: ClassVar[Kind]
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()
    """Fields its writer leaves out when they are None (the others it stores as null)."""
    KEYS: ClassVar[Mapping[str, str]] = {}
    """A field's JSON name where it is not a Python name (``from``)."""
    extra: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def _key(cls, name: str) -> str:
        return cls.KEYS.get(name, name)

    def dump(self) -> dict[str, Any]:
        """The JSON object stored as the record's payload."""
        out: dict[str, Any] = {}
        for name, key, omit_none in _dumped_fields(type(self)):
            value = getattr(self, name)
            if value is None and omit_none:
                continue
            out[key] = value.value if isinstance(value, enum.Enum) else value
        return out

    @classmethod
    def load(cls, raw: Mapping[str, object]) -> Self:
        """Tolerant decode: a missing or ill-typed field reads as its default."""
        hints = _hints(cls)
        known: dict[str, object] = {}
        names: set[str] = set()
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            key = cls._key(f.name)
            names.add(key)
            if key in raw and _fits(raw[key], hints[f.name]):
                known[f.name] = _convert(raw[key], hints[f.name])
        extra = {k: v for k, v in raw.items() if k not in names}
        return cls(**known, extra=extra)


# ---- one payload type per kind -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Created(Payload):
    KIND = Kind.CREATED
    flow: str | None = None
    queue: str | None = None
    inherited_cancel: bool = False


@dataclass(frozen=True, kw_only=True)
class ParentRecorded(Payload):
    KIND = Kind.PARENT_RECORDED
    parent: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClaimedAndActivated(Payload):
    """Built in SQL (``runs.claim_and_activate`` and friends), never in Python."""

    KIND = Kind.CLAIMED_AND_ACTIVATED
    OMIT_NONE = frozenset({"ahead_of"})
    KEYS = {"from_status": "from"}
    owner: str | None = None
    epoch: int | None = None
    from_status: str | None = None
    ahead_of: str | None = None
    """The run named by the wake, when this one took its slot by priority."""


@dataclass(frozen=True, kw_only=True)
class Claimed(Payload):
    KIND = Kind.CLAIMED
    claimant: str | None = None


@dataclass(frozen=True, kw_only=True)
class Activated(Payload):
    KIND = Kind.ACTIVATED
    owner: str | None = None
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class StolenAndActivated(Payload):
    KIND = Kind.STOLEN_AND_ACTIVATED
    OMIT_NONE = frozenset({"probe", "observer", "probe_detail"})
    owner: str | None = None
    epoch: int | None = None
    previous_owner: str | None = None
    previous_heartbeat_at_ms: int | None = None
    lease_age_ms: int | None = None
    probe: str | None = None
    observer: str | None = None
    probe_detail: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ClaimRecovered(Payload):
    KIND = Kind.CLAIM_RECOVERED
    OMIT_NONE = frozenset({"probe", "probe_detail"})
    claimant: str | None = None
    probe: str | None = None
    probe_detail: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ClaimAbandoned(Payload):
    KIND = Kind.CLAIM_ABANDONED
    claimant: str | None = None


@dataclass(frozen=True, kw_only=True)
class ClaimLost(Payload):
    """Evidence (``worker.evidence``): written once per address, so a pure function of it."""

    KIND = Kind.CLAIM_LOST
    observer: str | None = None
    status: str | None = None


@dataclass(frozen=True, kw_only=True)
class ActivationLost(Payload):
    KIND = Kind.ACTIVATION_LOST
    observer: str | None = None
    outcome: LostOutcome | None = None
    expected_epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class StealRefusedOwnerAlive(Payload):
    KIND = Kind.STEAL_REFUSED_OWNER_ALIVE
    OMIT_NONE = frozenset({"probe", "lease_age_ms"})
    evidence: RefusalEvidence | None = None
    """``lease-fresh`` (the owner renewed just in time) or ``probe`` (it vouched)."""
    observer: str | None = None
    heartbeat_at_ms: int | None = None
    probe: str | None = None
    lease_age_ms: int | None = None
    """Only in records of older versions (the record's time and the lease give it)."""


@dataclass(frozen=True, kw_only=True)
class Resumed(Payload):
    """An operator's decision: a quarantine released, or a dead run moved on."""

    KIND = Kind.RESUMED
    OMIT_NONE = frozenset({"accept_recorded", "rerun_step", "recoveries", "evidence"})
    KEYS = {"from_state": "from"}
    from_state: ResumedFrom | None = None
    actor: str | None = None
    note: str | None = None
    accept_recorded: bool | None = None
    rerun_step: str | None = None
    recoveries: int | None = None
    evidence: dict[str, Any] | None = None

    def dump(self) -> dict[str, Any]:
        out = super().dump()
        if self.from_state is ResumedFrom.QUARANTINE:  # its writer stores the null too
            out["rerun_step"] = self.rerun_step
        return out


@dataclass(frozen=True, kw_only=True)
class Transitioned(Payload):
    KIND = Kind.TRANSITIONED
    to: RunStatus | None = None
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class Parked(Payload):
    KIND = Kind.PARKED
    reason: str | None = None
    wake_at_ms: int | None = None
    token: str | None = None
    deferred: str | None = None
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class Woken(Payload):
    KIND = Kind.WOKEN
    reason: str | None = None
    cause: WakeCause | None = None
    """Who woke it: ``wake`` (a caller of ``Waits.wake``) or ``driver:<reason>``."""


@dataclass(frozen=True, kw_only=True)
class InterruptReleased(Payload):
    KIND = Kind.INTERRUPT_RELEASED
    OMIT_NONE = frozenset({"unconfirmed_ms"})
    cause: ReleaseCause | None = None
    detail: str | None = None
    owner: str | None = None
    epoch: int | None = None
    unconfirmed_ms: int | None = None


@dataclass(frozen=True, kw_only=True)
class CancelRequested(Payload):
    """Three writers: a direct request (``status``, ``note``, ``reason``, ``via``), a
    parent's cascade (``cause``, ``by``) and a cancel inherited at a join
    (``inherited_from``); ``actor`` (the authenticated role) in each."""

    KIND = Kind.CANCEL_REQUESTED
    OMIT_NONE = frozenset({"note", "reason", "status", "via", "cause", "by", "inherited_from"})
    actor: str | None = None
    note: str | None = None
    reason: str | None = None
    status: str | None = None
    via: str | None = None
    cause: CascadeCause | None = None
    by: str | None = None
    inherited_from: str | None = None

    def dump(self) -> dict[str, Any]:
        out = super().dump()
        if self.status is not None:  # a direct request stores its null note and reason
            out = {"actor": self.actor, "note": self.note, "reason": self.reason, **out}
        return out


@dataclass(frozen=True, kw_only=True)
class Interrupted(Payload):
    """The owner closed the run cancelled (``acknowledge_cancel``)."""

    KIND = Kind.INTERRUPTED
    OMIT_NONE = frozenset({"found_at_release", "by", "cause"})
    to: RunStatus | None = None
    epoch: int | None = None
    cancelled: bool = False
    found_at_release: str | None = None
    by: str | None = None
    cause: str | None = None


@dataclass(frozen=True, kw_only=True)
class HandedOff(Payload):
    KIND = Kind.HANDED_OFF
    to: RunStatus | None = None
    epoch: int | None = None
    successor: str | None = None
    round: int | None = None


@dataclass(frozen=True, kw_only=True)
class LineageExhausted(Payload):
    KIND = Kind.LINEAGE_EXHAUSTED
    to: RunStatus | None = None
    epoch: int | None = None
    max_rounds: int | None = None


@dataclass(frozen=True, kw_only=True)
class RoundInvalid(Payload):
    KIND = Kind.ROUND_INVALID
    to: RunStatus | None = None
    epoch: int | None = None
    successor: str | None = None


Settled: TypeAlias = Transitioned | Interrupted | HandedOff | LineageExhausted | RoundInvalid
"""A settlement's record (``store.settlements``, ``Lifecycle.hand_off``): each names the
status the run moved to and the epoch it was settled at."""


def settled_record(record: Settled | None, to: RunStatus, epoch: int) -> Settled:
    """``record`` (a plain ``transitioned`` when None) with the settlement's own ``to`` and
    ``epoch``: the store writes those, whatever the record was built with."""
    if record is None:
        return Transitioned(to=to, epoch=epoch)
    if record.to == to and record.epoch == epoch:  # as ``store.settlements`` builds them
        return record
    return dataclasses.replace(record, to=to, epoch=epoch)


@dataclass(frozen=True, kw_only=True)
class WakeScheduled(Payload):
    """No writer today: its fields, if any, are all ``extra``."""

    KIND = Kind.WAKE_SCHEDULED


@dataclass(frozen=True, kw_only=True)
class ChildPolicyApplied(Payload):
    KIND = Kind.CHILD_POLICY_APPLIED
    cause: CascadeCause | None = None
    cascaded_to: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Quarantined(Payload):
    KIND = Kind.QUARANTINED
    key: str | None = None
    problem: str | None = None


@dataclass(frozen=True, kw_only=True)
class DeadLettered(Payload):
    KIND = Kind.DEAD_LETTERED
    OMIT_NONE = frozenset({"probe_detail"})
    probe: str | None = None
    probe_detail: dict[str, Any] | None = None
    max_recoveries: int | None = None
    lost_owners: list[str] = field(default_factory=list)
    last_owner: str | None = None
    recoveries: int | None = None
    observer: str | None = None
    previous_owner: str | None = None
    previous_heartbeat_at_ms: int | None = None
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class LeaseReconfirmed(Payload):
    """Built in SQL (``runs.heartbeat``)."""

    KIND = Kind.LEASE_RECONFIRMED
    owner: str | None = None
    epoch: int | None = None
    confirmed_ms: int | None = None
    unconfirmed_ms: int | None = None


@dataclass(frozen=True, kw_only=True)
class DeferredCompleted(Payload):
    """Written by ``Deferreds.complete_deferred`` and by the SQL ``answer`` function."""

    KIND = Kind.DEFERRED_COMPLETED
    OMIT_NONE = frozenset({"answered_by", "note", "timed_out"})
    name: str | None = None
    woke: bool = False
    digest: str | None = None
    answered_by: str | None = None
    note: str | None = None
    timed_out: bool | None = None


@dataclass(frozen=True, kw_only=True)
class ClockFired(Payload):
    KIND = Kind.CLOCK_FIRED
    clock: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepRecorded(Payload):
    KIND = Kind.STEP_RECORDED
    key: str | None = None
    kind: str | None = None
    position: int | None = None
    epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepCompensated(Payload):
    KIND = Kind.STEP_COMPENSATED
    key: str | None = None


@dataclass(frozen=True, kw_only=True)
class StepCompensationFailed(Payload):
    KIND = Kind.STEP_COMPENSATION_FAILED
    key: str | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Answered(Payload):
    """An approval's answer, written by the SQL ``answer`` function (the token hashed)."""

    token: str | None = None
    actor: str | None = None
    note: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class ApprovalApproved(Answered):
    KIND = Kind.APPROVAL_APPROVED


@dataclass(frozen=True, kw_only=True)
class ApprovalDenied(Answered):
    KIND = Kind.APPROVAL_DENIED


@dataclass(frozen=True, kw_only=True)
class EventSet(Payload):
    KIND = Kind.EVENT_SET
    key: str | None = None
    version: int | None = None
    digest: str | None = None


@dataclass(frozen=True, kw_only=True)
class MessageSent(Payload):
    KIND = Kind.MESSAGE_SENT
    OMIT_NONE = frozenset({"message_id"})
    topic: str | None = None
    seq: int | None = None
    digest: str | None = None
    woke: bool = False
    message_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class MessageReceived(Payload):
    KIND = Kind.MESSAGE_RECEIVED
    topic: str | None = None
    seq: int | None = None
    key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Copied(Payload):
    """The source's side of a fork or a resume: the run that replays its history."""

    to: str | None = None
    calls: int | None = None
    actor: str | None = None  # the authenticated role that asked (session_user)
    note: str | None = None  # the caller's own words


@dataclass(frozen=True, kw_only=True)
class Forked(Copied):
    KIND = Kind.FORKED


@dataclass(frozen=True, kw_only=True)
class ResumedAs(Copied):
    KIND = Kind.RESUMED_AS


@dataclass(frozen=True, kw_only=True)
class ForkedFrom(Payload):
    """The new run's side (``history-copied``): ``kind`` says a fork or a resume."""

    KIND = Kind.FORKED_FROM
    KEYS = {"from_run": "from"}
    from_run: str | None = None
    calls: int | None = None
    kind: str | None = None
    actor: str | None = None  # the authenticated role that asked (session_user)
    note: str | None = None  # the caller's own words


@dataclass(frozen=True, kw_only=True)
class ProbeDetail(Payload):
    """The liveness probe's raw facts (``broker.liveness.Probe.detail``), journaled as
    ``probe_detail`` by takeovers, cleared claims and dead-letterings. ``key`` names the
    liveness key's case (``consistent``, ``absent``, ``malformed``, ``without-ttl``,
    ``ttl-implausible``, ``inconsistent``, ``lapsed``, ``unverified``; older records:
    ``present``, ``missing``, ``unreadable``); ``redis`` says how Redis answered."""

    key: str | None = None
    redis: str | None = None
    error: str | None = None
    ttl_ms: float | None = None
    max_ttl_ms: float | None = None
    confirmed_ms: int | None = None
    heartbeat_at_ms: int | None = None
    pid: int | None = None
    pid_state: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProbeEvidence:
    """What a worker's liveness probe found about a run's owner or claimant, journaled
    with the takeover it justified (``stolen-and-activated``, ``claim-recovered``,
    ``dead-lettered``): the probe's evidence, its raw facts (a ``ProbeDetail``'s fields)
    and who observed them. Not a record of its own."""

    probe: str | None = None
    probe_detail: dict[str, Any] | None = None
    observer: str | None = None


@dataclass(frozen=True)
class UnknownPayload:
    """A record this version cannot type: a kind it does not know, or a payload that is
    not a JSON object. ``fields`` is what there is to show."""

    kind: str
    fields: Mapping[str, object]


KnownPayload: TypeAlias = (
    Created
    | ParentRecorded
    | ClaimedAndActivated
    | Claimed
    | Activated
    | StolenAndActivated
    | ClaimRecovered
    | ClaimAbandoned
    | ClaimLost
    | ActivationLost
    | StealRefusedOwnerAlive
    | Resumed
    | Transitioned
    | Parked
    | Woken
    | InterruptReleased
    | CancelRequested
    | Interrupted
    | HandedOff
    | LineageExhausted
    | RoundInvalid
    | WakeScheduled
    | ChildPolicyApplied
    | Quarantined
    | DeadLettered
    | LeaseReconfirmed
    | DeferredCompleted
    | ClockFired
    | StepRecorded
    | StepCompensated
    | StepCompensationFailed
    | ApprovalApproved
    | ApprovalDenied
    | EventSet
    | MessageSent
    | MessageReceived
    | Forked
    | ResumedAs
    | ForkedFrom
)
Decoded: TypeAlias = KnownPayload | UnknownPayload

PAYLOADS: dict[Kind, type[KnownPayload]] = {cls.KIND: cls for cls in typing.get_args(KnownPayload)}
"""The payload type of every kind (tests/store/test_journal_records.py: none is missing)."""


def decode(kind: str, payload: object) -> Decoded:
    """A stored record's payload as its type; never raises (see the module's docstring)."""
    if not isinstance(payload, dict):
        return UnknownPayload(kind, {"value": payload})
    try:
        cls = PAYLOADS[Kind(kind)]
    except ValueError:
        return UnknownPayload(kind, payload)
    return cls.load(payload)
