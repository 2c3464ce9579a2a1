"""The JSON the CLI prints with ``--json``: one pydantic model per command's answer.

Scripts and dashboards parse these, so the models are the contract: a field is
added, never renamed or repurposed. All times are epoch milliseconds of the
database clock (``*_ms``); ages and delays are milliseconds too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from runfleet.store.types import Owner, RunRow, RunStatus, WaitingRow
from runfleet.store.waits import shown_waiting_token


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReadAnswer(_Model):
    """An answer a read-only command or dashboard page may read from a replica
    (RUNFLEET_READ_DATABASE_URL), so possibly as old as that replica's replay lag."""

    replica_lag_s: float | None = None
    """The dashboard's API: replay lag of the replica this answer was read from, None
    when the primary answered (or the replica does not know its lag). The CLI prints
    the same on stderr and leaves this None."""


class OwnerView(_Model):
    host: str
    pid: int
    nonce: str
    key: str

    @classmethod
    def of(cls, owner: Owner | None) -> OwnerView | None:
        if owner is None:
            return None
        return cls(host=owner.host_id, pid=owner.pid, nonce=owner.nonce, key=owner.key)


class WaitingView(_Model):
    reason: str
    wake_at_ms: int | None = None
    token: str | None = None
    request: Any = None
    deferred: str | None = None
    """The completion the wait is answered by (an event's name), when it names one."""


class RunSummary(_Model):
    id: str
    flow: str
    queue: str
    status: RunStatus
    owner: OwnerView | None
    epoch: int
    heartbeat_at_ms: int | None
    cancel_requested_at_ms: int | None
    waiting: WaitingView | None
    lineage_id: str
    round_ordinal: int
    parent_run_id: str | None
    created_at_ms: int
    updated_at_ms: int
    requeued_as: str | None = None
    """A failed run requeued (``runfleet retry``/``requeue``): the round that replaced it."""

    @classmethod
    def of(cls, row: RunRow, deferred: str | None = None) -> RunSummary:
        w = row.waiting
        return cls(
            id=row.id,
            flow=row.flow,
            queue=row.queue,
            status=row.status,
            owner=OwnerView.of(row.owner),
            epoch=row.epoch,
            heartbeat_at_ms=row.heartbeat_at_ms,
            cancel_requested_at_ms=row.cancel_requested_at_ms,
            waiting=WaitingView(
                reason=w.reason,
                wake_at_ms=w.wake_at_ms,
                token=shown_waiting_token(w.reason, w.token),
                request=w.request,
                deferred=deferred,
            )
            if w
            else None,
            lineage_id=row.lineage_id,
            round_ordinal=row.round_ordinal,
            parent_run_id=row.parent_run_id,
            created_at_ms=row.created_at_ms,
            updated_at_ms=row.updated_at_ms,
            requeued_as=row.requeued_as,
        )


class RunList(ReadAnswer):
    now_ms: int
    runs: list[RunSummary]


class ClockView(_Model):
    name: str
    due_at_ms: int


class DeferredView(_Model):
    name: str
    completed_at_ms: int
    consumed_at_ms: int | None
    value: Any = None


class RunDetail(ReadAnswer):
    run: RunSummary
    now_ms: int
    claim: OwnerView | None
    claimed_at_ms: int | None
    state: dict[str, Any]
    parents: list[str]
    children: list[str]
    pending_clocks: list[ClockView]
    deferreds: list[DeferredView]


class JournalEntry(_Model):
    seq: int
    at_ms: int
    kind: str
    source_id: str
    payload: Any
    sentence: str


class JournalView(ReadAnswer):
    run_id: str
    entries: list[JournalEntry]


class ProbeView(_Model):
    verdict: Literal["alive", "dead", "unknown"]
    evidence: str
    vouches: bool
    detail: dict[str, str | int | bool]


class LeaseView(_Model):
    heartbeat_at_ms: int
    age_ms: int
    stale_after_ms: int
    stale: bool


class ClaimView(_Model):
    claimant: OwnerView
    claimed_at_ms: int
    age_ms: int
    probe: ProbeView | None


class NextStep(_Model):
    summary: str
    within_ms: int | None
    """Roughly when it should happen (None: it waits on something outside runfleet)."""
    needs_person: bool


class Explanation(ReadAnswer):
    run: RunSummary
    now_ms: int
    status_since_ms: int
    owner_probe: ProbeView | None
    lease: LeaseView | None
    claim: ClaimView | None
    journal: list[JournalEntry]
    next: NextStep
    lines: list[str]
    """The plain-words answer, one sentence per line (what the text output prints)."""


class WaitingTreeRow(_Model):
    run_id: str
    reason: str
    wake_at_ms: int | None
    token: str | None
    request: Any
    depth: int

    @classmethod
    def of(cls, row: WaitingRow) -> WaitingTreeRow:
        return cls(
            run_id=row.run_id,
            reason=row.reason,
            wake_at_ms=row.wake_at_ms,
            token=shown_waiting_token(row.reason, row.token),
            request=row.request,
            depth=row.depth,
        )


class TreeNode(_Model):
    run: RunSummary
    attached: bool
    children: list[TreeNode]
    truncated: bool = False
    """Children not walked: the depth cap was hit, or this run was already shown (a diamond)."""


class TreeView(ReadAnswer):
    run: RunSummary
    children: list[TreeNode]
    rounds: list[RunSummary]
    waiting: list[WaitingTreeRow]


class FleetMemberView(_Model):
    host: str
    pid: int
    nonce: str
    started_ms: int | None
    age_ms: int | None
    confirmed_ms: int
    confirmed_age_ms: int
    lapsed: bool
    queues: list[str]
    runs_owned: int | None
    """Running rows the database says this process owns (None if it was not asked)."""
    runs_reported: int | None
    """Runs the process itself reported in its liveness key."""
    ttl_ms: int
    suspect: str | None = None
    """Why the key is not one a live worker writes (no TTL, an absurd time); None if it is."""


class QueueLimitView(_Model):
    """A configured queue's fleet-wide limit and the slots in use (docs/how-to/queues.md)."""

    name: str
    concurrency: int | None
    running: int
    default_priority: int
    rate_per_s: float | None = None
    keyed: bool = False
    """Its slots are shared round-robin across concurrency keys."""
    key_concurrency: int | None = None
    key_rate_per_s: float | None = None
    keys: list[KeyLimitView] = []
    """Its keys' next turns (at most ``KEYS_SHOWN``), the next first."""


class KeyLimitView(_Model):
    """One concurrency key of a keyed queue: its slots in use and its runs waiting."""

    key: str
    running: int
    waiting: int
    next_token_ms: int | None = None
    """Until the key's rate allows a start (None: no key rate)."""


QueueLimitView.model_rebuild()


class FleetView(ReadAnswer):
    now_ms: int
    workers: list[FleetMemberView]
    queues: list[QueueLimitView] = []
    """Configured queues (``runfleet queue set``); empty without the database."""


StuckKind = Literal[
    "stale-owner-alive",
    "takeover-overdue",
    "dead",
    "reactivated-often",
    "timer-not-fired",
    "quarantined",
    "no-worker-can-run",
    "pending-too-long",
]


class StuckItem(_Model):
    kind: StuckKind
    run: RunSummary
    age_ms: int
    detail: str
    action: str


class StuckView(_Model):
    now_ms: int
    items: list[StuckItem]


class Check(_Model):
    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str


class DoctorView(_Model):
    ok: bool
    checks: list[Check]
    schema_version: int | None
    latest_migration: int
    clock_skew_ms: int | None
    stream_lag: dict[str, int]
    live_workers: int | None


class EnqueueResult(_Model):
    run_id: str
    flow: str
    queue: str
    status: RunStatus


class CancelResult(_Model):
    run_id: str
    outcome: Literal["requested", "already-requested", "already-terminal"]
    status: RunStatus


class AnswerResult(_Model):
    """What ``resume``, ``approve``, ``deny``, ``complete`` and the dashboard's ``retry``
    did to a run (``retried``: ``run_id`` is the round that runs it again).

    ``complete``'s actions: ``completed`` (this value), ``already-completed`` (an earlier
    answer with this very value stands), ``answered-otherwise`` (another value won),
    ``timed-out`` (the wait's timeout came first), ``run-settled`` (it takes nothing)."""

    run_id: str
    action: Literal[
        "retried",
        "resumed",
        "approved",
        "denied",
        "completed",
        "already-completed",
        "answered-otherwise",
        "timed-out",
        "run-settled",
    ]
    status: RunStatus


class HistoryResult(_Model):
    """What ``fork``, ``resume`` (of a failed or cancelled run) and ``delete`` did.

    ``forked`` / ``resumed-as``: ``new_run_id`` replays the first ``calls`` recorded calls
    of ``run_id`` and is ``status``; ``deleted``: the lineage's rounds and how many journal
    records and recorded calls went with them."""

    run_id: str
    action: Literal["forked", "resumed-as", "deleted"]
    new_run_id: str | None = None
    calls: int | None = None
    status: RunStatus | None = None
    deleted_run_ids: list[str] = []
    journal: int | None = None
    steps: int | None = None


class PruneResult(_Model):
    """What ``runfleet prune`` deleted (or, with ``dry_run``, would delete), per table."""

    dry_run: bool
    settled_before_ms: int
    now_ms: int
    runs: int
    journal: int
    steps: int
    attempts: int
    deferreds: int
    clocks: int
    run_parents: int
    scanned: int
    batches: int
    longest_batch_ms: float
    consumers_pruned: int | None
    """Dead stream consumers deleted; None when not attempted (dry run, Redis unreachable)."""
    consumers_note: str | None = None
    keys_pruned: int | None = None
    """Concurrency keys deleted (no open run, bucket full again); None in a dry run."""


class QueueInfoLine(_Model):
    """One queue in ``runfleet info``."""

    queue: str
    pending: int
    """Ready to start (pending, its start time reached)."""
    scheduled: int
    """Pending until a start time (``enqueue_in`` / ``enqueue_at``)."""
    running: int
    waiting: int
    """Suspended on a durable wait (timer, event, approval, child, quota, released)."""
    dead: int
    """Parked ``dead`` after too many recoveries (``runfleet resume``)."""
    failed: int
    """Failed and not requeued yet (``runfleet requeue --all-failed``)."""
    workers: int | None
    """Live worker processes serving the queue; None when Redis did not answer."""


class InfoView(_Model):
    """``runfleet info``: rq's ``rq info`` — every queue at a glance, and the fleet."""

    now_ms: int
    queues: list[QueueInfoLine]
    workers: int | None
    """Live worker processes (not lapsed, not suspect); None when Redis did not answer."""
    failed: int
    """Failed runs not requeued yet, every queue."""
    redis_error: str | None = None


class RequeueResult(_Model):
    """``runfleet requeue --all-failed``: the failed runs requeued (or, dry, that would be)."""

    queue: str
    flow: str | None
    dry_run: bool
    requeued: dict[str, str]
    """Failed run id → the round that runs it again (``lineage@n``); with ``dry_run`` the
    failed runs that would be, each mapped to itself."""
    refused: dict[str, str] = {}
    """Failed run id → why it was not requeued (scopes, changed meanwhile)."""
