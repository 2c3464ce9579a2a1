"""A run's words and shapes: its statuses and policies, its owner and snapshot, its row
(``RunRow``), an admission request (``NewRun``) and a sweep's place among pending runs."""

from __future__ import annotations

import enum
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from runfleet.store.types.failure import RunError
from runfleet.store.types.options import AdmissionOptions

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
    """Higher starts first within its queue, with aging (docs/how-to/queues.md)."""
    dedup_key: str | None = None
    """At most one open run of the queue holds it (docs/how-to/queues.md)."""
    concurrency_key: str | None = None
    """Its fairness key, from its flow's key expression at admission (docs/how-to/queues.md)."""
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
    def error(self) -> RunError | None:
        """How a failed run failed (what the worker recorded, ``worker.settle.error_of``)."""
        return RunError.from_json(self.state.get("error"))

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
    def resumed_as(self) -> str | None:
        """The round that resumed this failed or cancelled one (``resume_run``)."""
        return _str_or_none(self.state.get("resumed_as"))

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
    options: AdmissionOptions = field(default_factory=AdmissionOptions)
    """What the run's state keeps besides these: rq's options, the ``@flow`` it was
    admitted with, the trace context, where it came from."""
    priority: int | None = None
    """Higher starts first within the queue (docs/how-to/queues.md); None: the queue's default."""
    dedup_key: str | None = None
    """While a run of the queue with this key is open, admission answers that run
    (``on_duplicate``): unlike the run id, the key is free again once the run settles."""
    on_duplicate: OnDuplicate = field(default_factory=lambda: OnDuplicate.JOIN)


@dataclass(frozen=True, slots=True)
class PendingCursor:
    run_id: str
    created_at_ms: int


def canonical_json(value: JsonValue) -> str:
    """Key-order-independent JSON text: the identity used for payload comparison and digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
