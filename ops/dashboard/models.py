"""The dashboard's own JSON answers, beside the CLI's (``ops.models``), which it reuses as is.

Like the CLI's models they are a contract for scripts: fields are added, never renamed.
Times are epoch milliseconds of the database clock.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from runfleet.ops.models import FleetView, JournalEntry, QueueLimitView, ReadAnswer, RunSummary


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueueCounts(_Model):
    queue: str
    pending: int
    running: int
    suspended: int
    completed: int
    """Admitted within the window and settled so (open statuses count every run)."""
    failed: int
    cancelled: int
    capped: bool
    """A count reached the read cap: the true number is at least this."""


class Series(_Model):
    """Journal records of one class per bucket, oldest bucket first, ending at ``end_ms``."""

    name: str
    color: str
    values: list[int]


class Chart(_Model):
    title: str
    bucket_ms: int
    end_ms: int
    series: list[Series]


class Steal(_Model):
    """A takeover or a refused takeover, with the evidence the thief journaled."""

    run_id: str
    entry: JournalEntry


class OverviewView(ReadAnswer):
    """``replica_lag_s`` (ReadAnswer): everything here may be that old."""

    now_ms: int
    window_ms: int
    fleet: FleetView | None
    fleet_error: str | None
    """Why the fleet is unknown (Redis did not answer)."""
    totals: dict[str, int]
    """Every run in the database by status."""
    queues: list[QueueCounts]
    charts: list[Chart]
    steals: list[Steal]
    """Takeovers, refused takeovers and poison runs parked dead, newest first."""
    dead: list[RunSummary] = []
    """Runs parked ``dead`` (their executions kept ending in a lost process), oldest
    first: each needs a person (``runfleet explain``, then ``runfleet resume``)."""
    limits: list[QueueLimitView] = []
    """Configured queues' limits, slots in use and keys (docs/how-to/queues.md)."""


class AttemptView(_Model):
    attempt: int
    started_at_ms: int | None
    finished_at_ms: int | None
    error: str | None


class StepView(_Model):
    key: str
    name: str
    kind: str
    position: int
    epoch: int
    recorded_at_ms: int
    compensated_at_ms: int | None
    output: str
    """The recorded output's stored text, cut to a preview."""
    attempts: list[AttemptView]


class StepsView(ReadAnswer):
    run_id: str
    steps: list[StepView]


class EventView(_Model):
    """One event a run set (``ctx.set_event``): its latest value, as a short preview."""

    key: str
    version: int
    set_at_ms: int
    value: str


class ForkView(_Model):
    """A run forked or resumed from this one (``runfleet fork`` / ``resume``)."""

    run_id: str
    kind: str
    """``fork`` or ``resumed-as``."""
    calls: int | None
    """How many of this run's recorded calls it replays."""
    actor: str | None
    note: str | None
    at_ms: int


class LifecycleView(ReadAnswer):
    """``/api/runs/<id>/lifecycle``: version, instance, events, messages, forks."""

    run_id: str
    version: str | None
    instance: str | None
    forked_from: str | None
    resumed_from: str | None
    resumed_as: str | None
    replays: int | None
    """Recorded calls this run copied from the run it was forked or resumed from."""
    events: list[EventView]
    messages_sent: int
    messages_received: int
    forks: list[ForkView]
