"""Journal records as sentences a person reads without knowing the payload schema.

One function per kind, fed by the payload fields the writers put there
(store/runs.py, store/lifecycle.py, store/waits.py, store/dag.py, worker/driver.py,
worker/evidence.py). A kind without a sentence yet (a newer writer, a flow feature
still being built) falls back to its name and fields: never an error, because an
audit trail must stay readable through a rolling deploy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runfleet.ops.cli.common import clock, seconds, who
from runfleet.store.journal import Kind
from runfleet.store.types import JournalRecord, Owner
from runfleet.store.waits import shown_token

Payload = dict[str, Any]

PROBE_WORDS: dict[str, str] = {
    "same-host-pid-dead": "its pid is gone on the same host",
    "same-host-pid-reused": "its pid now belongs to another process (no liveness key for it)",
    "same-host-pid-alive": "its pid is running on the same host",
    "cross-host-unreachable-stale": "its liveness key is absent",
    "cross-host-key-fresh": "its liveness key is fresh and matches the lease",
    "owner-lapsed": "it declared its own lease lapsed",
    "lease-expired": "the liveness probe could not vouch, so the lease alone decided",
}

_UNVOUCHED = ", so the lease alone decided"


def _when(ms: object) -> str:
    """A key's time in words, even an absurd one (a forged key may say 1970 or year 3000)."""
    if type(ms) is not int:
        return "?"
    try:
        return clock(ms) if abs(ms) < 10**15 and ms > 86_400_000 else f"{ms} ms after 1970"
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms after 1970"


def key_words(detail: object) -> str | None:
    """Which case of the liveness key applied, in words; None if the detail does not say.

    Reads the probe detail the driver journals (``probe_detail``) and the live probe
    of ``explain``; older records (``missing``, ``unreadable``) read the same.
    """
    if not isinstance(detail, dict):
        return None
    key = detail.get("key")
    if key == "unverified" or detail.get("redis") in ("unreachable", "error-reply"):
        if detail.get("redis") == "error-reply":
            return f"Redis answered with an error ({detail.get('error', '?')})"
        return "Redis unreachable"
    if key in ("absent", "missing"):
        return "key absent"
    if key in ("malformed", "unreadable"):
        why = f": {detail['error']}" if detail.get("error") else ""
        return f"key malformed{why}"
    if key == "without-ttl":
        return "key without TTL (no worker writes one)"
    if key == "ttl-implausible":
        ttl, limit = _ms(detail.get("ttl_ms")), _ms(detail.get("max_ttl_ms"))
        return f"key TTL {ttl}, above the {limit} a worker sets"
    if key == "inconsistent":
        confirmed, heartbeat = detail.get("confirmed_ms"), detail.get("heartbeat_at_ms")
        text = (
            f"key inconsistent: it says confirmed at {_when(confirmed)}, "
            f"the lease's heartbeat is {_when(heartbeat)}"
        )
        if type(confirmed) is int and type(heartbeat) is int:
            gap = confirmed - heartbeat
            later = "later: the owner renewed since without this run" if gap > 0 else "earlier"
            text += f" ({seconds(abs(gap))} {later})"
        return text
    if key == "lapsed":
        return "key says lapsed"
    if key in ("consistent", "present"):
        return "key matches the lease"
    return None


def probe_words(evidence: object, detail: object = None) -> str:
    """The probe's evidence in words; ``detail`` adds which liveness-key case applied."""
    text = str(evidence)
    words = PROBE_WORDS.get(text, f"probe said {text}")
    case = key_words(detail)
    if case is None:
        return words
    if text == "lease-expired":
        return f"the liveness probe could not vouch ({case}){_UNVOUCHED}"
    if text == "same-host-pid-alive" and case.startswith("Redis"):
        return f"{words} ({case}: its key was not checked)"
    return words


def _ms(value: object) -> str:
    return seconds(float(value)) if isinstance(value, int | float) else "?"


def _epoch(p: Payload) -> str:
    return f" (epoch {p['epoch']})" if "epoch" in p else ""


def _created(p: Payload, _r: JournalRecord) -> str:
    text = f"created as {p.get('flow', '?')} on queue {p.get('queue', '?')}"
    if p.get("inherited_cancel"):
        text += ", cancelled at admission because its parent was already cancelled or settled"
    return text


def _claimed_and_activated(p: Payload, _r: JournalRecord) -> str:
    details = [f"epoch {p['epoch']}"] if "epoch" in p else []
    if "from" in p:
        details.append(f"was {p['from']}")
    suffix = f" ({', '.join(details)})" if details else ""
    return f"claimed and started by {who(p.get('owner'))}{suffix}"


def _stolen(p: Payload, _r: JournalRecord) -> str:
    text = (
        f"stolen from {who(p.get('previous_owner'))} by {who(p.get('owner'))}: "
        f"lease stale {_ms(p.get('lease_age_ms'))} and "
        f"{probe_words(p.get('probe'), p.get('probe_detail'))}"
    )
    if p.get("probe"):
        text += f" [{p['probe']}]"
    return text + _epoch(p)


def _steal_refused(p: Payload, r: JournalRecord) -> str:
    owner = _evidence_owner(r)
    by = who(p.get("observer"))
    if p.get("evidence") == "lease-fresh":
        return f"takeover by {by} refused: {owner} renewed its lease just in time"
    heartbeat = p.get("heartbeat_at_ms")
    age = r.at_ms - heartbeat if isinstance(heartbeat, int) else p.get("lease_age_ms")
    return (
        f"takeover by {by} refused: lease stale {_ms(age)} but {owner} "
        f"is alive ({probe_words(p.get('probe'))}); re-probed on a backoff ladder"
    )


def _claim_lost(p: Payload, _r: JournalRecord) -> str:
    return (
        f"{who(p.get('observer'))} lost a claim race (the run was {p.get('status', '?')} by then)"
    )


def _activation_lost(p: Payload, _r: JournalRecord) -> str:
    what = "take it over" if p.get("outcome") == "snapshot-changed" else "activate it"
    return f"{who(p.get('observer'))} lost the race to {what}"


def _transitioned(p: Payload, _r: JournalRecord) -> str:
    to = p.get("to", "?")
    verb = "settled" if to in ("completed", "failed", "cancelled") else "moved to"
    return f"{verb} {to}{_epoch(p)}"


def _parked(p: Payload, _r: JournalRecord) -> str:
    reason = p.get("reason", "?")
    text = f"parked waiting for {reason}"
    if p.get("deferred"):
        text += f" {p['deferred']!r}"
    if p.get("wake_at_ms") is not None:
        text += f" until {clock(p['wake_at_ms'])}"
    if p.get("token"):
        token = shown_token(str(p["token"])) if reason == "approval" else p["token"]
        text += f" (token {token})"
    return text + _epoch(p)


def _woken(p: Payload, _r: JournalRecord) -> str:
    return f"woken from its {p.get('reason', '?')} wait (by {p.get('cause', '?')})"


def _released(p: Payload, _r: JournalRecord) -> str:
    cause = p.get("cause")
    why = "its lease lapsed" if cause == "lease-lapsed" else f"{p.get('detail') or cause}"
    return f"released by {who(p.get('owner'))} ({why}) so another worker resumes it{_epoch(p)}"


def _cancel_requested(p: Payload, _r: JournalRecord) -> str:
    if p.get("by"):  # a cascade: its own cancel path closes it
        return f"cancellation asked because {p['by']} ended ({p.get('cause', 'parent exit')})"
    if p.get("inherited_from"):
        return f"cancellation inherited from {p['inherited_from']} when it joined as a parent"
    text = f"cancellation requested while {p.get('status', '?')}"
    if p.get("via"):
        text += f" (asked of {p['via']}, an earlier round of this lineage)"
    text += _by(p)
    if p.get("reason"):
        text += f": {p['reason']}"
    return text


def _by(p: Payload) -> str:
    """' by <role> (<note>)': the authenticated role that decided, then the caller's words
    (records from before roles were journaled carry only the free-text actor)."""
    if not p.get("actor"):
        return f" ({p['note']})" if p.get("note") else ""
    return f" by {p['actor']}" + (f" ({p['note']})" if p.get("note") else "")


def _interrupted(p: Payload, r: JournalRecord) -> str:
    if not p.get("cancelled"):
        return f"interrupted ({_fields(p)})"
    if p.get("by") and p.get("by") != r.run_id:
        return f"cancelled because {p['by']} ended ({p.get('cause', 'parent exit')})"
    return f"cancelled by its owner{_epoch(p)}"


def _child_policy(p: Payload, _r: JournalRecord) -> str:
    cascaded = p.get("cascaded_to") or []
    return (
        f"{p.get('cause', 'parent exit')}: {len(cascaded)} attached descendant run(s) asked "
        "to cancel (each closes through its own cancel path)"
    )


def _claim_recovered(p: Payload, _r: JournalRecord) -> str:
    words = probe_words(p.get("probe"), p.get("probe_detail"))
    return f"stranded claim of {who(p.get('claimant'))} cleared: {words}"


def _resumed(p: Payload, _r: JournalRecord) -> str:
    if p.get("from") == "quarantine":
        how = (
            f"re-running step {p['rerun_step']!r}"
            if p.get("rerun_step")
            else "accepting the recorded outputs"
        )
        return f"released from quarantine{_by(p)}, {how}"
    if p.get("from") == "dead":
        return (
            f"moved on from dead{_by(p)}: its {p.get('recoveries', '?')} recoveries in a row "
            "were forgotten and its body re-runs from its last recorded step"
        )
    return f"resumed ({_fields(p)})"


def _dead_lettered(p: Payload, _r: JournalRecord) -> str:
    lost = p.get("lost_owners")
    owners = ", ".join(who(o) for o in lost) if isinstance(lost, list) and lost else "?"
    return (
        f"parked dead by {who(p.get('observer'))} instead of a takeover: the lease of "
        f"{who(p.get('previous_owner'))} went stale again after {p.get('recoveries', '?')} "
        f"takeover(s) in a row (max {p.get('max_recoveries', '?')}); processes lost, newest "
        f"first: {owners}"
    )


SENTENCES: dict[str, Callable[[Payload, JournalRecord], str]] = {
    Kind.CREATED: _created,
    Kind.PARENT_RECORDED: lambda p, _r: f"recorded as a child of {p.get('parent', '?')}",
    Kind.CLAIMED_AND_ACTIVATED: _claimed_and_activated,
    Kind.CLAIMED: lambda p, _r: f"claimed by {who(p.get('claimant'))}",
    Kind.ACTIVATED: lambda p, _r: f"started by {who(p.get('owner'))}{_epoch(p)}",
    Kind.STOLEN_AND_ACTIVATED: _stolen,
    Kind.CLAIM_RECOVERED: _claim_recovered,
    Kind.CLAIM_ABANDONED: lambda p, _r: f"claim abandoned by {who(p.get('claimant'))}",
    Kind.CLAIM_LOST: _claim_lost,
    Kind.ACTIVATION_LOST: _activation_lost,
    Kind.STEAL_REFUSED_OWNER_ALIVE: _steal_refused,
    Kind.RESUMED: _resumed,
    Kind.TRANSITIONED: _transitioned,
    Kind.PARKED: _parked,
    Kind.WOKEN: _woken,
    Kind.INTERRUPT_RELEASED: _released,
    Kind.CANCEL_REQUESTED: _cancel_requested,
    Kind.INTERRUPTED: _interrupted,
    Kind.CHILD_POLICY_APPLIED: _child_policy,
    Kind.DEFERRED_COMPLETED: lambda p, _r: (
        f"wait {p.get('name', '?')!r} timed out"
        if p.get("timed_out")
        else f"completion {p.get('name', '?')!r} recorded"
        + (" and it woke the run" if p.get("woke") else "")
    ),
    Kind.CLOCK_FIRED: lambda p, _r: f"timer {p.get('clock', '?')!r} fired",
    Kind.QUARANTINED: lambda p, _r: f"quarantined: {_fields(p)}",
    Kind.DEAD_LETTERED: _dead_lettered,
    Kind.HANDED_OFF: lambda p, _r: (
        f"completed this round and handed off to {p.get('successor', '?')}"
        f" (round {p.get('round', '?')})"
    ),
    Kind.LINEAGE_EXHAUSTED: lambda p, _r: (
        f"failed: its lineage reached max_rounds={p.get('max_rounds', '?')}"
    ),
    Kind.LEASE_RECONFIRMED: lambda p, _r: f"lease reconfirmed ({_fields(p)})",
    Kind.STEP_RECORDED: lambda p, _r: (
        f"recorded {p.get('kind', 'step')} {p.get('key', '?')!r} at position "
        f"{p.get('position', '?')}{_epoch(p)}"
    ),
    Kind.STEP_COMPENSATED: lambda p, _r: f"compensated step {p.get('key', '?')!r}",
    Kind.STEP_COMPENSATION_FAILED: lambda p, _r: (
        f"compensation of step {p.get('key', '?')!r} failed: {p.get('error', '?')}"
    ),
    Kind.APPROVAL_APPROVED: lambda p, _r: _decision("approved", p),
    Kind.APPROVAL_DENIED: lambda p, _r: _decision("denied", p),
    Kind.EVENT_SET: lambda p, _r: (
        f"set event {p.get('key', '?')!r} (value {p.get('version', '?')}, digest "
        f"{str(p.get('digest', '?'))[:8]})"
    ),
    Kind.MESSAGE_SENT: lambda p, _r: (
        f"message {p.get('seq', '?')} sent on {p.get('topic', '?')!r}"
        + (" and it woke the run" if p.get("woke") else "")
    ),
    Kind.MESSAGE_RECEIVED: lambda p, _r: (
        f"message {p.get('seq', '?')} on {p.get('topic', '?')!r} received by {p.get('key', '?')!r}"
    ),
    Kind.FORKED: lambda p, _r: (
        f"forked into {p.get('to', '?')}, which replays its first {p.get('calls', '?')} "
        f"recorded call(s)" + _by(p)
    ),
    Kind.RESUMED_AS: lambda p, _r: (
        f"resumed as {p.get('to', '?')}, which replays its first {p.get('calls', '?')} "
        f"recorded call(s)" + _by(p)
    ),
    Kind.FORKED_FROM: lambda p, _r: (
        f"{'resumes' if p.get('kind') == Kind.RESUMED_AS else 'forks'} {p.get('from', '?')}: "
        f"its first {p.get('calls', '?')} recorded call(s) are replayed, not run again" + _by(p)
    ),
    Kind.ROUND_INVALID: lambda p, _r: (
        f"failed: its next round {p.get('successor', '?')!r} could not be admitted"
    ),
}


def _decision(word: str, p: Payload) -> str:
    reason = f": {p['reason']}" if p.get("reason") else ""
    note = f" (note: {p['note']})" if p.get("note") else ""
    token = shown_token(str(p.get("token") or "")) or "?"
    return f"{word} by {p.get('actor', '?')}{note} (token {token}){reason}"


def _fields(p: Payload) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items()) or "no details"


def _evidence_owner(record: JournalRecord) -> str:
    """The owner an evidence record is about: it is part of the record's address.

    ``evidence:{run}:{host:pid:nonce}:{lease}:{kind}`` (store.journal.evidence_address);
    the run id is known, so the owner key is what sits between it and the lease.
    """
    prefix = f"evidence:{record.run_id}:"
    if not record.source_id.startswith(prefix):
        return "the owner"
    middle = record.source_id[len(prefix) :].rsplit(":", 2)[0]
    owner = Owner.parse(middle)
    return who(owner) if owner else "the owner"


def sentence(record: JournalRecord) -> str:
    """One record in plain words."""
    payload = record.payload if isinstance(record.payload, dict) else {"value": record.payload}
    render = SENTENCES.get(record.kind)
    if render is None:
        return f"{record.kind} ({_fields(payload)})"
    try:
        return render(payload, record)
    except Exception:  # an odd payload must not hide the rest of the journal
        return f"{record.kind} ({_fields(payload)})"
