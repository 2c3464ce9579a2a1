"""What the pages show, gathered from the same store/inspect calls the CLI's commands make.

Nothing here decides or re-words anything: runs, explanations, trees and fleets come
from ``ops.cli.runs``, ``ops.explain`` and ``ops.cli.fleet``; this module adds only the
fleet-wide aggregates the CLI has no command for (runs per queue, the journal's rate
of settlements and recoveries), read through existing store methods.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from runfleet.ops.cli import common as c
from runfleet.ops.cli.fleet import fleet_view, queue_limits
from runfleet.ops.dashboard.models import (
    AttemptView,
    Chart,
    OverviewView,
    QueueCounts,
    Series,
    Steal,
    StepsView,
    StepView,
)
from runfleet.ops.explain.report import entry
from runfleet.ops.models import FleetView, JournalView, RunSummary
from runfleet.store import journal_records as jr
from runfleet.store.journal_records import Kind
from runfleet.store.types import JournalRecord, RunStatus, WaitingReason

WINDOW_MS = 10 * 60_000
BUCKET_MS = 10_000
COUNT_CAP = 1000
"""Rows read per status for the per-queue table; a fuller count is ``runfleet runs``."""
_PAGE = 5000
_PAGES_PER_POLL = 8
"""Bounds one refresh's catch-up on a long journal; the next refresh goes on from there."""
STEALS_KEPT = 20
LAG_SEQS = 500
JOURNAL_MAX = 2000

_TAILED = (
    Kind.TRANSITIONED,
    Kind.INTERRUPTED,
    Kind.STOLEN_AND_ACTIVATED,
    Kind.STEAL_REFUSED_OWNER_ALIVE,
    Kind.INTERRUPT_RELEASED,
    Kind.CLAIM_RECOVERED,
    Kind.DEAD_LETTERED,
)
_STEALS = frozenset({Kind.STOLEN_AND_ACTIVATED, Kind.STEAL_REFUSED_OWNER_ALIVE, Kind.DEAD_LETTERED})
DEAD_SHOWN = 50


def settled_as(record: JournalRecord) -> RunStatus | None:
    """The terminal status a record settles its run in, if it is a settlement."""
    if record.kind not in (Kind.TRANSITIONED, Kind.INTERRUPTED):
        return None  # decoded only where it may say so: the charts ask of every record
    match jr.decode(record.kind, record.payload):
        case jr.Transitioned(to=RunStatus() as to) if to.terminal:
            return to
        case jr.Interrupted(cancelled=True):
            return RunStatus.CANCELLED
        case _:
            return None


@dataclass
class JournalTail:
    """The fleet-wide journal records the charts count, read incrementally by seq.

    Each refresh reads a kind's records after the last seq seen, less ``LAG_SEQS``: a
    seq is taken when a record is written, not when it commits, so a record may become
    visible after a higher one; the overlap catches it and ``seen`` drops the repeats.
    The journal has no index on kind, so a kind with no recent record would make every
    refresh scan from its old cursor: once a kind is read to the end, its cursor moves
    up to the newest run's last seq (a cheap high-water mark). The first refresh starts from the
    journal's beginning and reads at most ``_PAGES_PER_POLL`` pages per kind; later
    refreshes go on from there.
    """

    after: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TAILED, 0))
    recent: deque[JournalRecord] = field(default_factory=deque)
    steals: deque[JournalRecord] = field(default_factory=lambda: deque(maxlen=STEALS_KEPT))
    seen: set[int] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def _high_water(self, conns: c.Connections) -> int:
        newest = await conns.store.inspect.list_runs(limit=1)
        last = await conns.store.journal.last(newest[0].id, 1) if newest else []
        return last[-1].seq if last else 0

    async def _read(self, conns: c.Connections, kind: str) -> tuple[list[JournalRecord], bool]:
        """The kind's records after its cursor (less the lag); True if read to the end."""
        out: list[JournalRecord] = []
        after = max(0, self.after[kind] - LAG_SEQS)
        for _ in range(_PAGES_PER_POLL):
            batch = await conns.store.stats.records_of_kind(kind, after_seq=after, limit=_PAGE)
            out += batch
            if len(batch) < _PAGE:
                return out, True
            after = batch[-1].seq
        return out, False

    async def refresh(self, conns: c.Connections, now_ms: int) -> None:
        async with self.lock:
            high_water = await self._high_water(conns)
            fresh: list[JournalRecord] = []
            for kind in _TAILED:
                batch, complete = await self._read(conns, kind)
                top = max([self.after[kind], *(r.seq for r in batch)])
                self.after[kind] = max(top, high_water) if complete else top
                fresh += [r for r in batch if r.seq not in self.seen]
            fresh.sort(key=lambda r: r.seq)
            for record in fresh:
                self.seen.add(record.seq)
                if record.kind in _STEALS:
                    self.steals.append(record)
                if record.at_ms >= now_ms - WINDOW_MS:
                    self.recent.append(record)
            while self.recent and self.recent[0].at_ms < now_ms - WINDOW_MS:
                self.recent.popleft()
            floor = min(self.after.values()) - LAG_SEQS
            self.seen = {seq for seq in self.seen if seq > floor}

    def charts(self, now_ms: int) -> list[Chart]:
        n = WINDOW_MS // BUCKET_MS
        start = now_ms - n * BUCKET_MS

        def series(name: str, color: str, test: object) -> Series:
            values = [0] * n
            for r in self.recent:
                i = (r.at_ms - start) // BUCKET_MS
                if 0 <= i < n and test(r):  # type: ignore[operator]  # test is a record predicate, typed object by series()
                    values[i] += 1
            return Series(name=name, color=color, values=values)

        return [
            Chart(
                title="settled per 10 s",
                bucket_ms=BUCKET_MS,
                end_ms=now_ms,
                series=[
                    series("completed", "#2e7d32", lambda r: settled_as(r) is RunStatus.COMPLETED),
                    series("failed", "#c62828", lambda r: settled_as(r) is RunStatus.FAILED),
                    series("cancelled", "#757575", lambda r: settled_as(r) is RunStatus.CANCELLED),
                ],
            ),
            Chart(
                title="recovery per 10 s",
                bucket_ms=BUCKET_MS,
                end_ms=now_ms,
                series=[
                    series("taken over", "#e65100", lambda r: r.kind == Kind.STOLEN_AND_ACTIVATED),
                    series("released", "#6a1b9a", lambda r: r.kind == Kind.INTERRUPT_RELEASED),
                    series("claims cleared", "#1565c0", lambda r: r.kind == Kind.CLAIM_RECOVERED),
                    series(
                        "refused (owner alive)",
                        "#f9a825",
                        lambda r: r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE,
                    ),
                    series("parked dead", "#212121", lambda r: r.kind == Kind.DEAD_LETTERED),
                ],
            ),
        ]


async def fleet(conns: c.Connections, now_ms: int) -> tuple[FleetView | None, str | None]:
    """``runfleet fleet --json``; None with the reason when Redis does not answer."""
    if conns.redis is None:
        return None, conns.redis_error or "no Redis"
    try:
        members = await conns.liveness.fleet(now_ms)
    except Exception as exc:  # the page still shows the database's side
        return None, f"Redis did not answer: {exc}"
    return fleet_view(members, await conns.store.stats.running_by_owner(), now_ms), None


async def queue_counts(conns: c.Connections, now_ms: int) -> list[QueueCounts]:
    """Open runs per queue and status; settled ones admitted within the window."""
    inspect = conns.store.inspect
    rows = []
    for status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED):
        rows.append(await inspect.list_runs(status=status, limit=COUNT_CAP))
    rows.append(await inspect.list_runs(since_ms=now_ms - WINDOW_MS, limit=COUNT_CAP))
    capped = any(len(batch) >= COUNT_CAP for batch in rows)
    counts: dict[str, dict[RunStatus, int]] = {}
    seen: set[str] = set()
    for batch in rows:
        for row in batch:
            if row.id in seen or (batch is rows[-1] and not row.status.terminal):
                continue
            seen.add(row.id)
            per = counts.setdefault(row.queue, dict.fromkeys(RunStatus, 0))
            per[row.status] += 1
    return [
        QueueCounts(
            queue=q,
            pending=per[RunStatus.PENDING],
            running=per[RunStatus.RUNNING],
            suspended=per[RunStatus.SUSPENDED],
            completed=per[RunStatus.COMPLETED],
            failed=per[RunStatus.FAILED],
            cancelled=per[RunStatus.CANCELLED],
            capped=capped,
        )
        for q, per in sorted(counts.items())
    ]


async def overview(conns: c.Connections, tail: JournalTail) -> OverviewView:
    now = await conns.store.stats.now_ms()
    await tail.refresh(conns, now)
    members, problem = await fleet(conns, now)
    totals = await conns.store.stats.status_counts()
    return OverviewView(
        now_ms=now,
        window_ms=WINDOW_MS,
        fleet=members,
        fleet_error=problem,
        totals={s.value: n for s, n in totals.items()},
        queues=await queue_counts(conns, now),
        charts=tail.charts(now),
        steals=[Steal(run_id=r.run_id, entry=entry(r)) for r in reversed(tail.steals)],
        dead=[
            RunSummary.of(row)
            for row in await conns.store.inspect.waiting_for(WaitingReason.DEAD, limit=DEAD_SHOWN)
        ],
        limits=await queue_limits(conns.store),
    )


async def journal(conns: c.Connections, run_id: str) -> JournalView:
    """``runfleet journal RUN --json`` (the first ``JOURNAL_MAX`` records)."""
    await conns.run_row(run_id)
    records = await conns.store.journal.records(run_id, after_seq=0, limit=JOURNAL_MAX)
    return JournalView(run_id=run_id, entries=[entry(r) for r in records])


def _preview(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def steps(conns: c.Connections, run_id: str) -> StepsView:
    """Recorded steps, each with the attempts that produced its output."""
    await conns.run_row(run_id)
    out: list[StepView] = []
    for s in await conns.store.steps.of_run(run_id):
        attempts = await conns.store.steps.attempts(run_id, s.key)
        out.append(
            StepView(
                key=s.key,
                name=s.name,
                kind=s.kind,
                position=s.position,
                epoch=s.epoch,
                recorded_at_ms=s.recorded_at_ms,
                compensated_at_ms=s.compensated_at_ms,
                output=_preview(s.stored),
                attempts=[
                    AttemptView(
                        attempt=int(a["attempt"]),
                        started_at_ms=a.get("started_at_ms"),
                        finished_at_ms=a.get("finished_at_ms"),
                        error=a.get("error"),
                    )
                    for a in attempts
                ],
            )
        )
    return StepsView(run_id=run_id, steps=out)
