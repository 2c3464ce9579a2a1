"""What happens next to a run, predicted from the rules the driver and the sweeps follow.

Pure: it reads ``Facts`` gathered once by ``ops.explain.report`` and says what the fleet
will do and roughly when, or that a person is needed (DESIGN §5 takeover, §7 sweeps).
Kept apart from the gathering so each rule here can be read beside the code it mirrors.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import assert_never

from runfleet.broker.liveness import FleetMember, Probe
from runfleet.ops.cli.common import clock, seconds, who
from runfleet.ops.explain.journal_text import probe_words
from runfleet.ops.explain.keys import key_wait
from runfleet.ops.explain.lifecycle_text import message_topic
from runfleet.ops.models import NextStep
from runfleet.store.config import Settings
from runfleet.store.journal_records import DeadLettered
from runfleet.store.queues import KeyState, QueueSettings
from runfleet.store.types import JournalRecord, RunRow, RunStatus, WaitingReason, WaitingRow
from runfleet.store.waits import shown_token


@dataclass(frozen=True)
class Facts:
    """Everything the prediction reads; gathered once so describing is pure."""

    row: RunRow
    settings: Settings
    history: list[JournalRecord]
    owner_probe: Probe | None
    claim_probe: Probe | None
    fleet: list[FleetMember] | None
    """None when Redis did not answer: then nobody can say who is alive."""
    redis_error: str | None
    lag: int | None
    deferred: str | None
    waiting_tree: list[WaitingRow]
    queue: QueueSettings | None = None
    """The run's queue's settings (docs/how-to/queues.md); None: unlimited, priority 0."""
    queue_running: int = 0
    """Runs of the queue executing now (the slots in use of a limited one)."""
    rate_wait_ms: int | None = None
    """Until the queue's rate allows a start (0: now; None: no rate)."""
    key: KeyState | None = None
    """The run's concurrency key on its keyed queue (``ops.explain.keys``)."""
    lifecycle: list[str] = field(default_factory=list)
    """Lines about the run's events and messages (``ops.explain.lifecycle_text``)."""

    @property
    def now(self) -> int:
        return self.row.now_ms

    def readers(self) -> list[FleetMember] | None:
        """Live, unlapsed workers reading this run's queue (None: unknown)."""
        if self.fleet is None:
            return None
        return [m for m in self.fleet if self.row.queue in m.queues and not m.lapsed]

    def last(self, kinds: Collection[str]) -> JournalRecord | None:
        return next((r for r in reversed(self.history) if r.kind in kinds), None)


def _readers_problem(facts: Facts) -> str | None:
    readers = facts.readers()
    if readers is not None and not readers:
        return f"no live worker reads queue {facts.row.queue}: it waits until one starts"
    return None


def next_step(facts: Facts) -> NextStep:
    row = facts.row
    if row.status.terminal:
        if row.handed_off_to:
            return NextStep(
                summary=f"nothing here: the lineage continues in {row.handed_off_to}.",
                within_ms=None,
                needs_person=False,
            )
        return NextStep(
            summary=f"nothing: {row.status.value} is final.", within_ms=None, needs_person=False
        )
    if row.status is RunStatus.RUNNING:
        return _next_running(facts)
    if row.status is RunStatus.PENDING:
        return _next_pending(facts)
    return _next_suspended(facts)


def _next_running(facts: Facts) -> NextStep:
    row, cfg = facts.row, facts.settings
    assert row.owner is not None and row.heartbeat_at_ms is not None
    owner, probe = who(row.owner), facts.owner_probe
    age = facts.now - row.heartbeat_at_ms
    left = cfg.stale_after_ms - age
    sweep = cfg.sweep_tick_max_ms
    if left >= 0:
        if probe is not None and probe.verdict == "dead":
            return NextStep(
                summary=f"{owner} is gone ({probe_words(probe.evidence)}); the lease turns stale "
                f"in {seconds(left)}, then the stale-running sweep takes the run over within "
                f"~{seconds(sweep)}.",
                within_ms=left + sweep,
                needs_person=False,
            )
        if row.cancel_requested_at_ms is not None:
            return NextStep(
                summary=f"{owner} sees the cancel request at its next heartbeat (within "
                f"~{seconds(cfg.heartbeat_interval_ms)}) and settles the run as cancelled.",
                within_ms=cfg.heartbeat_interval_ms,
                needs_person=False,
            )
        return NextStep(
            summary=f"it is executing on {owner} and settles when the flow returns; if {owner} "
            "stopped renewing, the lease would turn stale at "
            f"{clock(row.heartbeat_at_ms + cfg.stale_after_ms)} and another worker would take "
            "over.",
            within_ms=None,
            needs_person=False,
        )
    if probe is not None and probe.vouches:
        return NextStep(
            summary=f"{owner} is alive ({probe.evidence}) but has not renewed its lease for "
            f"{seconds(age)}: takeovers are refused while the probe vouches for it (re-probed on "
            f"a backoff up to {seconds(int(cfg.reprobe_backoff_max * 1000))}). Look at that "
            "process: stopped (SIGSTOP), a blocked event loop, or cut off from the database.",
            within_ms=None,
            needs_person=True,
        )
    problem = _readers_problem(facts)
    if problem:
        return NextStep(
            summary=f"the lease is stale and {owner} does not answer, but {problem}.",
            within_ms=None,
            needs_person=True,
        )
    evidence = probe_words(probe.evidence) if probe else "the lease alone (no probe answered)"
    overdue = -left > cfg.takeover_overdue_ms
    summary = (
        f"the stale-running sweep will try a takeover within ~{seconds(sweep)} "
        f"(the evidence would be: lease stale {seconds(age)} and {evidence})."
    )
    if row.recoveries >= cfg.max_recoveries:
        summary = (
            f"the stale-running sweep will park it dead within ~{seconds(sweep)} instead of "
            f"a takeover: it was already taken over {row.recoveries} time(s) in a row after "
            f"lost processes (RUNFLEET_MAX_RECOVERIES={cfg.max_recoveries})."
        )
    if overdue:
        summary += (
            f" It is overdue: the lease has been stale for {seconds(-left)}; check that the "
            f"workers on queue {row.queue} know flow {row.flow}."
        )
    return NextStep(summary=summary, within_ms=sweep, needs_person=overdue)


def dead_words(row: RunRow, evidence: object) -> str:
    """Why a run is parked ``dead``, in plain words, from the evidence its park recorded."""
    seen = DeadLettered.load(evidence if isinstance(evidence, dict) else {})
    limit = seen.max_recoveries if seen.max_recoveries is not None else row.recoveries
    lost = [who(o) for o in seen.lost_owners]
    text = (
        f"it is parked dead: its executions kept ending with their worker process lost "
        f"(os._exit, a crash, an OOM kill or a fail-stop exit), and after {limit} takeover(s) "
        "in a row (RUNFLEET_MAX_RECOVERIES) it was not handed to another worker to kill"
    )
    if lost:
        text += f"; processes lost, newest first: {', '.join(lost)}"
    return text + "."


def _next_pending(facts: Facts) -> NextStep:
    row, cfg = facts.row, facts.settings
    sweep, now = cfg.sweep_tick_max_ms, facts.now
    if row.cancel_requested_at_ms is not None:
        return NextStep(
            summary="the pending-cancellation sweep closes it as cancelled within "
            f"~{seconds(sweep)}.",
            within_ms=sweep,
            needs_person=False,
        )
    problem = _readers_problem(facts)
    if row.waiting is not None and row.waiting.wake_at_ms is not None:
        return _timed(facts, row.waiting.wake_at_ms, "becomes startable", problem)
    if row.claim is not None and row.claimed_at_ms is not None:
        held = now - row.claimed_at_ms
        probe = facts.claim_probe
        if held <= cfg.stale_after_ms:
            return NextStep(
                summary=f"{who(row.claim)} claimed it {seconds(held)} ago and is starting it.",
                within_ms=cfg.stale_after_ms - held,
                needs_person=False,
            )
        if probe is not None and probe.vouches:
            return NextStep(
                summary=f"{who(row.claim)} is alive but has held the claim {seconds(held)} "
                "without starting the run: look at that process.",
                within_ms=None,
                needs_person=True,
            )
        return NextStep(
            summary=f"the claim of {who(row.claim)} is stranded; the next drive clears it and a "
            f"worker starts the run (the lost-wake sweep re-schedules it within "
            f"~{seconds(cfg.lost_wake_within_ms)}).",
            within_ms=cfg.lost_wake_within_ms,
            needs_person=False,
        )
    if facts.rate_wait_ms:
        assert facts.queue is not None and facts.queue.rate_per_s is not None
        return NextStep(
            summary=f"waiting for the rate limit of queue {row.queue} "
            f"({facts.queue.rate_per_s:g}/s fleet-wide): next token in "
            f"{seconds(facts.rate_wait_ms)}.",
            within_ms=facts.rate_wait_ms,
            needs_person=False,
        )
    keyed = key_wait(row, facts.queue, facts.key)
    if keyed is not None:
        return NextStep(
            summary=keyed, within_ms=facts.key.wait_ms if facts.key else None, needs_person=False
        )
    limit = facts.queue.concurrency if facts.queue is not None else None
    if limit is not None and facts.queue_running >= limit:
        tail = f"; but {problem}" if problem else ""
        return NextStep(
            summary=f"waiting for a slot of queue {row.queue}: {facts.queue_running} of "
            f"{limit} in use fleet-wide; it starts when one of them settles or parks "
            f"(priority {row.priority}, highest first){tail}.",
            within_ms=None,
            needs_person=problem is not None,
        )
    if problem:
        return NextStep(summary=problem + ".", within_ms=None, needs_person=True)
    age = now - row.created_at_ms
    lag = f" ({facts.lag} entries wait on the stream)" if facts.lag is not None else ""
    if age <= cfg.lost_pending_after_ms:
        return NextStep(
            summary=f"a worker on queue {row.queue} will claim it when a slot frees{lag}.",
            within_ms=None,
            needs_person=False,
        )
    return NextStep(
        summary=f"pending for {seconds(age)}: the workers on queue {row.queue} may all be busy"
        f"{lag}; once they reach it, a lost wake is re-scheduled within "
        f"~{seconds(cfg.lost_wake_within_ms)}. If it stays pending, check "
        f"that they know flow {row.flow} (their log says run.unknown_flow otherwise).",
        within_ms=None,
        needs_person=facts.lag == 0,
    )


def _timed(facts: Facts, due_ms: int, verb: str, problem: str | None) -> NextStep:
    sweep = facts.settings.sweep_tick_max_ms
    delta = due_ms - facts.now
    if delta > 0:
        tail = f"; but {problem}" if problem else ""
        return NextStep(
            summary=f"the due sweep {verb} it at {clock(due_ms)} (in {seconds(delta)}){tail}.",
            within_ms=delta + sweep,
            needs_person=False,
        )
    if -delta <= facts.settings.due_overdue_ms:
        return NextStep(
            summary=f"due now: the due sweep {verb} it within ~{seconds(sweep)}.",
            within_ms=sweep,
            needs_person=False,
        )
    return NextStep(
        summary=f"due {seconds(-delta)} ago but not acted on: "
        + (problem or "are the workers' sweeps running (any `sweep.failed` in their logs)?")
        + ".",
        within_ms=None,
        needs_person=True,
    )


def _next_suspended(facts: Facts) -> NextStep:
    row, cfg = facts.row, facts.settings
    sweep = cfg.sweep_tick_max_ms
    w = row.waiting
    problem = _readers_problem(facts)
    if row.cancel_requested_at_ms is not None:
        return NextStep(
            summary=f"the parked-run sweep wakes it within ~{seconds(sweep)} and a worker closes "
            "it as cancelled.",
            within_ms=sweep,
            needs_person=False,
        )
    if w is None:
        return NextStep(
            summary=problem + "."
            if problem
            else "its wait is answered; a worker resumes it "
            f"(re-scheduled within ~{seconds(cfg.woken_grace_ms + sweep)} if its wake was "
            "lost).",
            within_ms=None if problem else cfg.woken_grace_ms + sweep,
            needs_person=problem is not None,
        )
    match w.reason:
        case WaitingReason.RELEASED:
            return NextStep(
                summary=problem + "."
                if problem
                else f"it was released by a shutdown or a lease "
                f"lapse; a worker on queue {row.queue} resumes it within ~{seconds(sweep)}.",
                within_ms=None if problem else sweep,
                needs_person=problem is not None,
            )
        case WaitingReason.TIMER | WaitingReason.QUOTA:
            if w.wake_at_ms is not None:
                return _timed(facts, w.wake_at_ms, "wakes", problem)
        case WaitingReason.QUARANTINE:
            return NextStep(
                summary="a recorded step output failed its digest check or could not be "
                "decoded; only an operator's resume moves it (accept the recorded output, or "
                "re-run the step).",
                within_ms=None,
                needs_person=True,
            )
        case WaitingReason.DEAD:
            return NextStep(
                summary=dead_words(row, w.request) + " Only a person moves it: find why in "
                f"the workers' logs (their exit codes, OOM kills, segfaults, `worker.failstop`; "
                f"run_id {row.id}), fix the flow or the host, then `runfleet resume {row.id}` "
                "(its body re-runs from its last recorded step, the count starts again) or "
                f"`runfleet cancel {row.id}`.",
                within_ms=None,
                needs_person=True,
            )
        case WaitingReason.APPROVAL:
            return NextStep(
                summary=f"a person must answer the approval (token {shown_token(w.token)}); "
                "it resumes then.",
                within_ms=None,
                needs_person=True,
            )
        case WaitingReason.EVENT if (topic := message_topic(row)) is not None:
            return NextStep(
                summary=f"waiting for a message on {topic!r}: it resumes when one is sent "
                f"(Queue.send(run_id, {topic!r}, value)).",
                within_ms=None,
                needs_person=False,
            )
        case WaitingReason.EVENT:
            name = repr(facts.deferred) if facts.deferred else "its event"
            return NextStep(
                summary=f"waiting for event {name}: it resumes when something completes it.",
                within_ms=None,
                needs_person=False,
            )
        case WaitingReason.CHILD:
            others = [t for t in facts.waiting_tree if t.run_id != row.id]
            if others:
                first = others[0]
                return NextStep(
                    summary=f"waiting for child runs; deepest wait: {first.run_id} waits for "
                    f"{first.reason}"
                    + (f" until {clock(first.wake_at_ms)}" if first.wake_at_ms else "")
                    + ".",
                    within_ms=None,
                    needs_person=False,
                )
        case _:
            assert_never(w.reason)
    return NextStep(
        summary=f"waiting for {w.reason}: it resumes when that wait is answered.",
        within_ms=None,
        needs_person=False,
    )
