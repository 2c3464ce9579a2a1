"""``runfleet explain RUN``: why a run is where it is, and what happens next, in plain words.

It gathers what the fleet itself would consult — the row (database time), the
liveness probe a thief would run against the owner, the journal, the fleet's live
workers and the queue's stream lag — and predicts from the same rules the driver
and the sweeps follow (DESIGN §5, §7), so the prediction is what will happen, not
a guess: "the stale-running sweep will try a takeover within ~1 s".
"""

from __future__ import annotations

import json

from runfleet.broker.liveness import FleetMember, Probe
from runfleet.ops.cli.common import Connections, clock, seconds, who
from runfleet.ops.cli.text import literal
from runfleet.ops.explain.journal_text import probe_words, sentence
from runfleet.ops.explain.lifecycle_text import lifecycle_lines
from runfleet.ops.explain.predict import Facts, next_step
from runfleet.ops.models import (
    ClaimView,
    Explanation,
    JournalEntry,
    LeaseView,
    NextStep,
    OwnerView,
    ProbeView,
    RunSummary,
)
from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.inspect import DEFAULT_REACTIVATED_OVER
from runfleet.store.journal_records import Kind
from runfleet.store.queues import KeyState
from runfleet.store.types import (
    JournalRecord,
    Owner,
    RunError,
    RunRow,
    RunStatus,
    WaitingReason,
)
from runfleet.store.waits import masked_payload, shown_waiting_token

JOURNAL_SHOWN = 12
_HISTORY = 200
_ENTERS: dict[RunStatus, set[str]] = {
    RunStatus.PENDING: {Kind.CREATED},
    RunStatus.RUNNING: {Kind.CLAIMED_AND_ACTIVATED, Kind.ACTIVATED},
    RunStatus.SUSPENDED: {
        Kind.PARKED,
        Kind.INTERRUPT_RELEASED,
        Kind.TRANSITIONED,
        Kind.DEAD_LETTERED,
    },
    RunStatus.COMPLETED: {Kind.TRANSITIONED, Kind.HANDED_OFF},
    RunStatus.FAILED: {Kind.TRANSITIONED, Kind.LINEAGE_EXHAUSTED},
    RunStatus.CANCELLED: {Kind.TRANSITIONED, Kind.INTERRUPTED},
}
_OWNED = {Kind.CLAIMED_AND_ACTIVATED, Kind.ACTIVATED, Kind.STOLEN_AND_ACTIVATED}


def entry(record: JournalRecord) -> JournalEntry:
    return JournalEntry(
        seq=record.seq,
        at_ms=record.at_ms,
        kind=record.kind,
        source_id=record.source_id,
        payload=masked_payload(record.kind, record.payload),
        sentence=sentence(record),
    )


def probe_view(probe: Probe | None) -> ProbeView | None:
    if probe is None:
        return None
    return ProbeView(
        verdict=probe.verdict, evidence=probe.evidence, vouches=probe.vouches, detail=probe.detail
    )


def _if_stale(row: RunRow, at_ms: int | None, stale_after_ms: int) -> int | None:
    """The lease time to check a key against, as a thief would: only once it is stale.

    A thief probes only a stale lease, whose owner (if alive) has stopped renewing, so
    its key's confirmed time sits still near the row's. While the lease is fresh both
    move every interval and a key read between a renewal and its refresh could look
    inconsistent: there the key is judged on TTL, shape and lapse alone.
    """
    if at_ms is None or row.now_ms - at_ms <= stale_after_ms:
        return None
    return at_ms


async def gather(conns: Connections, run_id: str) -> Facts:
    row = await conns.run_row(run_id)
    store = conns.store
    history = await store.journal.last(run_id, _HISTORY)
    owner_probe = claim_probe = None
    fleet: list[FleetMember] | None = None
    lag: int | None = None
    if conns.redis is not None:
        live = conns.liveness
        if row.owner is not None and row.status is RunStatus.RUNNING:
            stale_ms = conns.settings.stale_after_ms
            owner_probe = await live.probe(row.owner, _if_stale(row, row.heartbeat_at_ms, stale_ms))
        if row.claim is not None:
            claimed = _if_stale(row, row.claimed_at_ms, conns.settings.stale_after_ms)
            claim_probe = await live.probe(row.claim, claimed)
        fleet = await live.fleet(row.now_ms or None)
        if not row.status.terminal:
            lag = await conns.streams.lag(row.queue)
    deferred = await store.inspect.waiting_deferred(run_id) if row.waiting else None
    tree = await store.waits.waiting_tree(run_id) if row.status is RunStatus.SUSPENDED else []
    return Facts(
        row,
        conns.settings,
        history,
        owner_probe,
        claim_probe,
        fleet,
        conns.redis_error,
        lag,
        deferred,
        tree,
        queue=await store.queues.get(row.queue),
        queue_running=(await store.queues.running([row.queue]))[row.queue],
        rate_wait_ms=await store.queues.wait_ms(row.queue),
        key=await _key(store, row),
        lifecycle=await lifecycle_lines(store, row, fleet),
    )


def explain(facts: Facts) -> Explanation:
    row, now = facts.row, facts.now
    since = facts.last(_ENTERS.get(row.status, set()))
    since_ms = since.at_ms if since else row.updated_at_ms
    lease = None
    if row.heartbeat_at_ms is not None and row.status is RunStatus.RUNNING:
        age = now - row.heartbeat_at_ms
        stale_ms = facts.settings.stale_after_ms
        lease = LeaseView(
            heartbeat_at_ms=row.heartbeat_at_ms,
            age_ms=age,
            stale_after_ms=stale_ms,
            stale=age > stale_ms,
        )
    claim = None
    claimant = OwnerView.of(row.claim)
    if claimant is not None and row.claimed_at_ms is not None:
        claim = ClaimView(
            claimant=claimant,
            claimed_at_ms=row.claimed_at_ms,
            age_ms=now - row.claimed_at_ms,
            probe=probe_view(facts.claim_probe),
        )
    step = next_step(facts)
    shown = facts.history[-JOURNAL_SHOWN:]
    return Explanation(
        run=RunSummary.of(row, facts.deferred),
        now_ms=now,
        status_since_ms=since_ms,
        owner_probe=probe_view(facts.owner_probe),
        lease=lease,
        claim=claim,
        journal=[entry(r) for r in shown],
        next=step,
        lines=lines(facts, since_ms, step),
    )


# ---- plain words -----------------------------------------------------------------


def lines(facts: Facts, since_ms: int, step: NextStep) -> list[str]:
    """The explanation in words, one line each: what a run stored (its id, error, notes,
    answers) is ``literal`` in them, so a newline or escape it holds cannot start a line
    of its own ("next: …") on a terminal, in ``--json`` or on the dashboard."""
    row, now = facts.row, facts.now
    out = [
        f"run {row.id} ({row.flow} on queue {row.queue}) is {row.status.value} since "
        f"{clock(since_ms)} ({seconds(now - since_ms)} ago)"
        + (f", round {row.round_ordinal} of lineage {row.lineage_id}" if row.round_ordinal else "")
        + "."
    ]
    out += _outcome(row)
    if row.status is RunStatus.RUNNING and row.owner is not None:
        out.append(_owner_line(facts, row.owner))
        assert row.heartbeat_at_ms is not None
        age = now - row.heartbeat_at_ms
        stale = facts.settings.stale_after_ms
        state = f"STALE by {seconds(age - stale)}" if age > stale else "fresh"
        out.append(f"lease: renewed {seconds(age)} ago; stale after {seconds(stale)} — {state}.")
    if row.claim is not None and row.claimed_at_ms is not None:
        probe = facts.claim_probe
        seen = f"; claimant {probe.verdict} ({probe.evidence})" if probe else ""
        out.append(f"claim: held by {who(row.claim)} for {seconds(now - row.claimed_at_ms)}{seen}.")
    if row.waiting is not None:
        out.append(f"waiting: {_waiting_words(facts)}.")
    if row.cancel_requested_at_ms is not None:
        out.append(
            f"cancel: requested at {clock(row.cancel_requested_at_ms)} "
            f"({seconds(now - row.cancel_requested_at_ms)} ago)."
        )
    elif not row.status.terminal:
        out.append("cancel: not requested.")
    out += _restarts(facts)
    out += facts.lifecycle
    if facts.redis_error:
        out.append(f"liveness: unknown — Redis did not answer ({facts.redis_error}).")
    out.append(f"last decisions ({min(len(facts.history), JOURNAL_SHOWN)} of the journal):")
    out += [f"  {clock(r.at_ms)}  {sentence(r)}" for r in facts.history[-JOURNAL_SHOWN:]]
    out.append(("next: " if not step.needs_person else "needs a person: ") + step.summary)
    return [literal(line) for line in out]


def _restarts(facts: Facts) -> list[str]:
    """Takeovers and releases: each restarted the body from its last recorded call."""
    takeovers = sum(1 for r in facts.history if r.kind == Kind.STOLEN_AND_ACTIVATED)
    releases = sum(1 for r in facts.history if r.kind == Kind.INTERRUPT_RELEASED)
    total = takeovers + releases
    out = []
    row, limit = facts.row, facts.settings.max_recoveries
    if row.recoveries and not row.status.terminal:
        out.append(
            f"recoveries: taken over {row.recoveries} time(s) in a row after its process was "
            f"lost, of {limit} allowed (RUNFLEET_MAX_RECOVERIES); "
            + (
                "it is parked dead."
                if row.waiting is not None and row.waiting.reason == WaitingReason.DEAD
                else "at the limit the next lost process parks it dead."
            )
        )
    if total == 0:
        return out
    text = (
        f"restarts: its body was restarted {total} time(s) from an interruption "
        f"(takeovers: {takeovers}, releases: {releases}; epoch {facts.row.epoch})"
    )
    if total > DEFAULT_REACTIVATED_OVER and not facts.row.status.terminal:
        text += (
            f" — more than {DEFAULT_REACTIVATED_OVER}, so `runfleet stuck` lists it: it likely "
            "fails the same way each time (look for run.drive_failed or lease.lapsed in the "
            "workers' logs)"
        )
    return [*out, text + "."]


def _outcome(row: RunRow) -> list[str]:
    if row.status is RunStatus.COMPLETED:
        text = _preview(row.result)
        if row.handed_off_to:
            return [f"result: round handed off to {row.handed_off_to}."]
        return [f"result: {text}."]
    if row.status is RunStatus.FAILED:
        error = row.error or RunError()
        return [f"error: {error.type or '?'}" + (f": {error.message}" if error.message else "")]
    if row.status is RunStatus.CANCELLED:
        cancellation = row.cancellation or {}
        return [f"cancellation: {_preview(cancellation)}."]
    return []


def _preview(value: object, limit: int = 160) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _owner_line(facts: Facts, owner: Owner) -> str:
    probe = facts.owner_probe
    if probe is None:
        alive = "liveness unknown (Redis did not answer)"
    else:
        verdict = {"alive": "alive right now", "dead": "NOT alive", "unknown": "liveness unknown"}
        words = probe_words(probe.evidence, probe.detail)
        alive = f"{verdict[probe.verdict]} ({probe.evidence}: {words})"
    text = f"owner: {who(owner)} (nonce {owner.nonce}, epoch {facts.row.epoch}) — {alive}"
    took = facts.last(_OWNED)
    if took is not None:
        stolen = jr.decode(took.kind, took.payload)
        if isinstance(stolen, jr.StolenAndActivated):
            text += f"; took the run over from {who(stolen.previous_owner)} at {clock(took.at_ms)}"
    return text + "."


def _waiting_words(facts: Facts) -> str:
    w = facts.row.waiting
    assert w is not None
    text = str(w.reason)
    if facts.deferred and w.reason != WaitingReason.TIMER:
        text += f" {facts.deferred!r}"
    if w.wake_at_ms is not None:
        delta = w.wake_at_ms - facts.now
        when = f"in {seconds(delta)}" if delta >= 0 else f"{seconds(-delta)} ago"
        text += f", due {clock(w.wake_at_ms)} ({when})"
    if w.token:
        text += f", token {shown_waiting_token(w.reason, w.token)}"
    if w.request is not None:
        text += f", request {_preview(w.request, 120)}"
    return text


async def _key(store: Store, row: RunRow) -> KeyState | None:
    """The run's key on its queue (None: no key, or a queue that is not keyed)."""
    if row.concurrency_key is None:
        return None
    found = await store.queues.keys(row.queue, row.concurrency_key, limit=1)
    return found[0] if found else None
