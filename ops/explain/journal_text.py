"""Journal records as sentences a person reads without knowing the payload schema.

One ``case`` per payload type (``store.journal_records``), so mypy proves every kind
has a sentence (``assert_never``). A record this version cannot type (a newer
writer's kind, a payload that is not an object) falls back to its name and fields;
an ill-typed field reads as absent (``?``): never an error, because an audit trail
must stay readable through a rolling deploy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import assert_never

from runfleet.ops.cli.common import clock, seconds, who
from runfleet.store import journal_records as jr
from runfleet.store.journal_records import Kind, ReleaseCause, ResumedFrom
from runfleet.store.types import JournalRecord, Owner, WaitingReason
from runfleet.store.waits import shown_token

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
    d = jr.ProbeDetail.load(detail)
    if d.key == "unverified" or d.redis in ("unreachable", "error-reply"):
        if d.redis == "error-reply":
            return f"Redis answered with an error ({_q(d.error)})"
        return "Redis unreachable"
    match d.key:
        case "absent" | "missing":
            return "key absent"
        case "malformed" | "unreadable":
            why = f": {d.error}" if d.error else ""
            return f"key malformed{why}"
        case "without-ttl":
            return "key without TTL (no worker writes one)"
        case "ttl-implausible":
            return f"key TTL {_ms(d.ttl_ms)}, above the {_ms(d.max_ttl_ms)} a worker sets"
        case "inconsistent":
            confirmed, heartbeat = d.confirmed_ms, d.heartbeat_at_ms
            text = (
                f"key inconsistent: it says confirmed at {_when(confirmed)}, "
                f"the lease's heartbeat is {_when(heartbeat)}"
            )
            if confirmed is not None and heartbeat is not None:
                gap = confirmed - heartbeat
                later = "later: the owner renewed since without this run" if gap > 0 else "earlier"
                text += f" ({seconds(abs(gap))} {later})"
            return text
        case "lapsed":
            return "key says lapsed"
        case "consistent" | "present":
            return "key matches the lease"
        case _:
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
    """A duration in words; ``?`` for one no clock could show (absent, NaN, infinite)."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "?"
    try:
        return seconds(float(value))
    except (OverflowError, ValueError):
        return "?"


def _q(value: object, absent: str = "?") -> str:
    """A field as shown: ``?`` (or ``absent``) when the record does not carry it."""
    return absent if value is None else str(value)


def _epoch(epoch: int | None) -> str:
    return f" (epoch {epoch})" if epoch is not None else ""


def _created(p: jr.Created) -> str:
    text = f"created as {_q(p.flow)} on queue {_q(p.queue)}"
    if p.inherited_cancel:
        text += ", cancelled at admission because its parent was already cancelled or settled"
    return text


def _claimed_and_activated(p: jr.ClaimedAndActivated) -> str:
    details = [f"epoch {p.epoch}"] if p.epoch is not None else []
    if p.from_status is not None:
        details.append(f"was {p.from_status}")
    suffix = f" ({', '.join(details)})" if details else ""
    return f"claimed and started by {who(p.owner)}{suffix}"


def _stolen(p: jr.StolenAndActivated) -> str:
    text = (
        f"stolen from {who(p.previous_owner)} by {who(p.owner)}: "
        f"lease stale {_ms(p.lease_age_ms)} and "
        f"{probe_words(p.probe, p.probe_detail)}"
    )
    if p.probe:
        text += f" [{p.probe}]"
    return text + _epoch(p.epoch)


def _steal_refused(p: jr.StealRefusedOwnerAlive, r: JournalRecord) -> str:
    owner = _evidence_owner(r)
    by = who(p.observer)
    if p.evidence is jr.RefusalEvidence.LEASE_FRESH:
        return f"takeover by {by} refused: {owner} renewed its lease just in time"
    age = r.at_ms - p.heartbeat_at_ms if p.heartbeat_at_ms is not None else p.lease_age_ms
    return (
        f"takeover by {by} refused: lease stale {_ms(age)} but {owner} "
        f"is alive ({probe_words(p.probe)}); re-probed on a backoff ladder"
    )


def _activation_lost(p: jr.ActivationLost) -> str:
    what = "take it over" if p.outcome is jr.LostOutcome.SNAPSHOT_CHANGED else "activate it"
    return f"{who(p.observer)} lost the race to {what}"


def _transitioned(p: jr.Transitioned) -> str:
    verb = "settled" if p.to is not None and p.to.terminal else "moved to"
    return f"{verb} {_q(p.to)}{_epoch(p.epoch)}"


def _parked(p: jr.Parked) -> str:
    text = f"parked waiting for {_q(p.reason)}"
    if p.deferred:
        text += f" {p.deferred!r}"
    if p.wake_at_ms is not None:
        text += f" until {clock(p.wake_at_ms)}"
    if p.token:
        token = shown_token(p.token) if p.reason == WaitingReason.APPROVAL else p.token
        text += f" (token {token})"
    return text + _epoch(p.epoch)


def _released(p: jr.InterruptReleased) -> str:
    match p.cause:
        case ReleaseCause.LEASE_LAPSED:
            why = "its lease lapsed"
        case ReleaseCause.INTERRUPTED | None:
            why = p.detail or _q(p.cause, "None")
        case _:
            assert_never(p.cause)
    return f"released by {who(p.owner)} ({why}) so another worker resumes it{_epoch(p.epoch)}"


def _cancel_requested(p: jr.CancelRequested) -> str:
    if p.by:  # a cascade: its own cancel path closes it
        return f"cancellation asked because {p.by} ended ({_q(p.cause, 'parent exit')})"
    if p.inherited_from:
        return f"cancellation inherited from {p.inherited_from} when it joined as a parent"
    text = f"cancellation requested while {_q(p.status)}"
    if p.via:
        text += f" (asked of {p.via}, an earlier round of this lineage)"
    text += _by(p.actor, p.note)
    if p.reason:
        text += f": {p.reason}"
    return text


def _by(actor: str | None, note: str | None) -> str:
    """' by <role> (<note>)': the authenticated role that decided, then the caller's words
    (records from before roles were journaled carry only the free-text actor)."""
    if not actor:
        return f" ({note})" if note else ""
    return f" by {actor}" + (f" ({note})" if note else "")


def _interrupted(p: jr.Interrupted, r: JournalRecord, raw: Mapping[str, object]) -> str:
    if not p.cancelled:
        return f"interrupted ({_fields(raw)})"
    if p.by and p.by != r.run_id:
        return f"cancelled because {p.by} ended ({_q(p.cause, 'parent exit')})"
    return f"cancelled by its owner{_epoch(p.epoch)}"


def _child_policy(p: jr.ChildPolicyApplied) -> str:
    return (
        f"{_q(p.cause, 'parent exit')}: {len(p.cascaded_to)} attached descendant run(s) asked "
        "to cancel (each closes through its own cancel path)"
    )


def _resumed(p: jr.Resumed, raw: Mapping[str, object]) -> str:
    match p.from_state:
        case ResumedFrom.QUARANTINE:
            how = (
                f"re-running step {p.rerun_step!r}"
                if p.rerun_step
                else "accepting the recorded outputs"
            )
            return f"released from quarantine{_by(p.actor, p.note)}, {how}"
        case ResumedFrom.DEAD:
            return (
                f"moved on from dead{_by(p.actor, p.note)}: its {_q(p.recoveries)} recoveries in "
                "a row were forgotten and its body re-runs from its last recorded step"
            )
        case None:
            return f"resumed ({_fields(raw)})"
        case _:
            assert_never(p.from_state)


def _dead_lettered(p: jr.DeadLettered) -> str:
    owners = ", ".join(who(o) for o in p.lost_owners) if p.lost_owners else "?"
    return (
        f"parked dead by {who(p.observer)} instead of a takeover: the lease of "
        f"{who(p.previous_owner)} went stale again after {_q(p.recoveries)} "
        f"takeover(s) in a row (max {_q(p.max_recoveries)}); processes lost, newest "
        f"first: {owners}"
    )


def _deferred_completed(p: jr.DeferredCompleted) -> str:
    if p.timed_out:
        return f"wait {_q(p.name)!r} timed out"
    return f"completion {_q(p.name)!r} recorded" + (" and it woke the run" if p.woke else "")


def _copied(verb: str, p: jr.Copied) -> str:
    return f"{verb} {_q(p.to)}, which replays its first {_q(p.calls)} recorded call(s)" + _by(
        p.actor, p.note
    )


def _decision(word: str, p: jr.Answered) -> str:
    reason = f": {p.reason}" if p.reason else ""
    note = f" (note: {p.note})" if p.note else ""
    token = shown_token(p.token or "") or "?"
    return f"{word} by {_q(p.actor)}{note} (token {token}){reason}"


def _fields(p: Mapping[str, object]) -> str:
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


def render(p: jr.Decoded, r: JournalRecord, raw: Mapping[str, object]) -> str:
    """A decoded record in words: one case per payload type, checked complete by mypy."""
    match p:
        case jr.Created():
            return _created(p)
        case jr.ParentRecorded():
            return f"recorded as a child of {_q(p.parent)}"
        case jr.ClaimedAndActivated():
            return _claimed_and_activated(p)
        case jr.Claimed():
            return f"claimed by {who(p.claimant)}"
        case jr.Activated():
            return f"started by {who(p.owner)}{_epoch(p.epoch)}"
        case jr.StolenAndActivated():
            return _stolen(p)
        case jr.ClaimRecovered():
            words = probe_words(p.probe, p.probe_detail)
            return f"stranded claim of {who(p.claimant)} cleared: {words}"
        case jr.ClaimAbandoned():
            return f"claim abandoned by {who(p.claimant)}"
        case jr.ClaimLost():
            return f"{who(p.observer)} lost a claim race (the run was {_q(p.status)} by then)"
        case jr.ActivationLost():
            return _activation_lost(p)
        case jr.StealRefusedOwnerAlive():
            return _steal_refused(p, r)
        case jr.Resumed():
            return _resumed(p, raw)
        case jr.Transitioned():
            return _transitioned(p)
        case jr.Parked():
            return _parked(p)
        case jr.Woken():
            return f"woken from its {_q(p.reason)} wait (by {_q(p.cause)})"
        case jr.InterruptReleased():
            return _released(p)
        case jr.CancelRequested():
            return _cancel_requested(p)
        case jr.Interrupted():
            return _interrupted(p, r, raw)
        case jr.ChildPolicyApplied():
            return _child_policy(p)
        case jr.DeferredCompleted():
            return _deferred_completed(p)
        case jr.ClockFired():
            return f"timer {_q(p.clock)!r} fired"
        case jr.Quarantined():
            return f"quarantined: {_fields(raw)}"
        case jr.DeadLettered():
            return _dead_lettered(p)
        case jr.HandedOff():
            return f"completed this round and handed off to {_q(p.successor)} (round {_q(p.round)})"
        case jr.LineageExhausted():
            return f"failed: its lineage reached max_rounds={_q(p.max_rounds)}"
        case jr.RoundInvalid():
            return f"failed: its next round {_q(p.successor)!r} could not be admitted"
        case jr.LeaseReconfirmed():
            return f"lease reconfirmed ({_fields(raw)})"
        case jr.StepRecorded():
            return (
                f"recorded {_q(p.kind, 'step')} {_q(p.key)!r} at position "
                f"{_q(p.position)}{_epoch(p.epoch)}"
            )
        case jr.StepCompensated():
            return f"compensated step {_q(p.key)!r}"
        case jr.StepCompensationFailed():
            return f"compensation of step {_q(p.key)!r} failed: {_q(p.error)}"
        case jr.ApprovalApproved():
            return _decision("approved", p)
        case jr.ApprovalDenied():
            return _decision("denied", p)
        case jr.EventSet():
            return f"set event {_q(p.key)!r} (value {_q(p.version)}, digest {_q(p.digest)[:8]})"
        case jr.MessageSent():
            return f"message {_q(p.seq)} sent on {_q(p.topic)!r}" + (
                " and it woke the run" if p.woke else ""
            )
        case jr.MessageReceived():
            return f"message {_q(p.seq)} on {_q(p.topic)!r} received by {_q(p.key)!r}"
        case jr.Forked():
            return _copied("forked into", p)
        case jr.ResumedAs():
            return _copied("resumed as", p)
        case jr.ForkedFrom():
            verb = "resumes" if p.kind == Kind.RESUMED_AS else "forks"
            return (
                f"{verb} {_q(p.from_run)}: its first {_q(p.calls)} recorded call(s) are "
                "replayed, not run again" + _by(p.actor, p.note)
            )
        case jr.WakeScheduled() | jr.UnknownPayload():
            return f"{r.kind} ({_fields(raw)})"
        case _:
            assert_never(p)


def sentence(record: JournalRecord) -> str:
    """One record in plain words."""
    raw = record.payload if isinstance(record.payload, dict) else {"value": record.payload}
    try:
        return render(jr.decode(record.kind, record.payload), record, raw)
    except Exception:  # an odd payload must not hide the rest of the journal
        return f"{record.kind} ({_fields(raw)})"
