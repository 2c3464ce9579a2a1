"""Parks and wakes, deferred completions and durable clocks.

A park and a deferred completion both lock the run row first, so a completion
that commits before the park is seen by it (AlreadySatisfied) and one that
commits after it wakes the parked run: either way the completion is never lost.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psycopg.types.json import Json, Jsonb

from store import validate
from store.config import Settings
from store.db import Database
from store.errors import InvalidInput, LimitExceeded, NotAnswerable
from store.journal import Journal, Kind
from store.rows import clock_row, deferred_row, owner_params, run_row, waiting_row
from store.types import (
    AlreadySatisfied,
    AlreadyTerminal,
    ClockAlreadyCompleted,
    ClockCompleted,
    ClockExisting,
    ClockFiring,
    ClockRow,
    ClockScheduled,
    DeferredCompleted,
    DeferredExisting,
    DeferredRow,
    GuardFailed,
    NotFound,
    NotOwner,
    NotWaiting,
    Owner,
    Parked,
    ParkOutcome,
    RunStatus,
    Waiting,
    WaitingReason,
    WaitingRow,
    WakeOutcome,
    Woken,
)

CHILD_DEFERRED = "child:"
"""Prefix of the deferred a parent awaits a child through (see waits.notify_parents)."""

INTERNAL_PREFIXES = ("approval:", "child:", "spawn:", "sleep:", "step:", "quota:")
"""Namespaces of the deferreds runfleet completes itself (approvals, children, timers,
retry backoffs, quotas): an answer from outside never writes one a flow did not declare.
runfleet.answer (migration 0009) enforces them; keep its pattern in step with this."""

_RUNFLEETS = "children, timers, sleeps and quotas are settled by runfleet only"
_NOT_YOURS = {
    "approval": "an approval wait: answer it with approve/deny and its token",
    "child": "a child wait: only the child's own settlement answers it",
    "timer": "a durable timer: only its clock fires it",
    "quota": "a quota window: only its time ends it",
}

TOKEN_HASH = "sha256:"


def token_hash(token: str) -> str:
    """How an approval token is stored (waiting row, step output, journal): its sha256.

    Tokens are 192 random bits, so an unsalted hash cannot be reversed by guessing."""
    return TOKEN_HASH + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def shown_token(stored: str | None) -> str | None:
    """What a view may print of an approval token: at most 8 characters of its hash."""
    if not stored:
        return stored
    return stored.removeprefix(TOKEN_HASH)[:8] + "…"


def shown_waiting_token(reason: WaitingReason, token: str | None) -> str | None:
    """A waiting row's token as views print it: an approval's masked, others (an event's
    name, a child's id) as they are."""
    return shown_token(token) if reason == WaitingReason.APPROVAL else token


def masked_payload(kind: str, payload: Any) -> Any:
    """A journal payload as views print it: approval tokens cut to ``shown_token``."""
    if not isinstance(payload, dict) or not payload.get("token"):
        return payload
    if kind in ("approval-approved", "approval-denied") or payload.get("reason") == "approval":
        return {**payload, "token": shown_token(str(payload["token"]))}
    return payload


def _known_reason(reason: str) -> WaitingReason:
    """The reason as the enum; refused (InvalidInput) when it is none of them.

    Rows are read back as ``WaitingReason``: a word outside it must never be stored.
    """
    try:
        return WaitingReason(reason)
    except ValueError:
        raise InvalidInput("waiting.reason", f"{reason!r} is not a waiting reason") from None


class AnswerOutcome(StrEnum):
    """What runfleet.answer (migration 0009) decided; each maps to a result or an error."""

    ANSWERED = "answered"
    EXISTING = "existing"
    TERMINAL = "terminal"
    NOT_FOUND = "not_found"
    NOT_ANSWERABLE = "not_answerable"
    LIMIT = "limit"
    NO_MATCH = "no_match"


@dataclass(frozen=True, slots=True)
class Completion:
    """A deferred completion and whether it cleared the run's wait (caller sends a wake)."""

    outcome: DeferredCompleted | DeferredExisting | AlreadyTerminal
    woke: bool


class Waits:
    def __init__(self, db: Database, journal: Journal, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings

    # ---- park / wake -------------------------------------------------------

    async def release(
        self, run_id: str, me: Owner, epoch: int, cause: str, detail: str
    ) -> ParkOutcome:
        """Hand a run ``me`` owns back unsettled (shutdown, lapse, a failed drive): park it
        ``released`` (no cancel guard: it is not a settlement) and journal why, in one
        transaction. Parked, or NotOwner/NotFound when the fence was already gone."""
        async with self._db.transaction():
            outcome = await self.park(
                run_id, me, epoch, Waiting(reason=WaitingReason.RELEASED), guard=False
            )
            if isinstance(outcome, Parked):
                await self._journal.record(
                    run_id,
                    Kind.INTERRUPT_RELEASED,
                    {"cause": cause, "detail": detail, "owner": me.key, "epoch": epoch},
                )
            return outcome

    async def quarantine(
        self, run_id: str, me: Owner, epoch: int, key: str, problem: dict[str, Any]
    ) -> ParkOutcome:
        """A recorded output of step ``key`` no longer matches its digest: journal the
        problem (owner-fenced) and park the run for an operator's decision, in one
        transaction. The record stays even when a cancel request refuses the park."""
        async with self._db.transaction():
            await self._journal.emit_owned(run_id, me, epoch, Kind.QUARANTINED, problem)
            return await self.park(
                run_id,
                me,
                epoch,
                Waiting(reason=WaitingReason.QUARANTINE, token=key, request=problem),
            )

    async def park(
        self,
        run_id: str,
        me: Owner,
        epoch: int,
        waiting: Waiting,
        *,
        deferred: str | None = None,
        guard: bool = True,
    ) -> ParkOutcome:
        """Suspend a run ``me`` owns until ``waiting`` is answered (owner-fenced).

        ``deferred`` names the completion that answers the wait: if it already
        completed, the run does not park (AlreadySatisfied) and keeps running.
        With ``guard``, a pending cancel request refuses the park (GuardFailed).
        """
        reason = _known_reason(waiting.reason)
        validate.json_value("waiting.request", waiting.request, self._settings.max_payload_bytes)
        async with self._db.transaction():
            locked = await self._db.one("runs.get_for_update", {"id": run_id})
            if locked is None:
                return NotFound(run_id)
            current = run_row(locked)
            if (
                current.status is not RunStatus.RUNNING
                or current.owner != me
                or (current.epoch != epoch)
            ):
                return NotOwner(current)
            if guard and current.cancel_requested_at_ms is not None:
                return GuardFailed(current)
            if deferred is not None and deferred.startswith(CHILD_DEFERRED):
                # A settling child completes this deferred under the child's row lock, not
                # ours (waits.notify_parents): wait for any settlement in flight to commit,
                # or the check below misses its completion and the park is never woken.
                await self._db.one(
                    "waits.lock_child", {"id": deferred.removeprefix(CHILD_DEFERRED)}
                )
            if deferred is not None and await self.deferred(run_id, deferred) is not None:
                return AlreadySatisfied(deferred)
            await self._db.one(
                "waits.park",
                {
                    "id": run_id,
                    "epoch": epoch,
                    "reason": reason,
                    "wake_at_ms": waiting.wake_at_ms,
                    "token": waiting.token,
                    "request": Jsonb(waiting.request) if waiting.request is not None else None,
                    "deferred": deferred,
                    **owner_params(me),
                },
            )
            await self._journal.record(
                run_id,
                Kind.PARKED,
                {
                    "reason": reason,
                    "wake_at_ms": waiting.wake_at_ms,
                    "token": waiting.token,
                    "deferred": deferred,
                    "epoch": epoch,
                },
            )
            return Parked(
                WaitingRow(run_id, reason, waiting.wake_at_ms, waiting.token, waiting.request)
            )

    async def wake(self, run_id: str, *, cause: str = "wake") -> WakeOutcome:
        """Clear a run's wait so the claim path can resume it (idempotent)."""
        async with self._db.transaction():
            row = await self._db.one("waits.wake", {"id": run_id})
            if row is None:
                exists = await self._db.one("runs.get", {"id": run_id})
                return NotWaiting(run_id) if exists else NotFound(run_id)
            woken = waiting_row(row)
            await self._journal.record(run_id, Kind.WOKEN, {"reason": woken.reason, "cause": cause})
            return Woken(woken)

    async def waiting(self, run_id: str) -> WaitingRow | None:
        row = await self._db.one("waits.waiting", {"id": run_id})
        return waiting_row(row) if row else None

    async def waiting_runs(
        self,
        *,
        reason: str | None = None,
        due_before_ms: int | None = None,
        due_now: bool = False,
        cancel_requested: bool | None = None,
        limit: int = 1000,
    ) -> list[WaitingRow]:
        rows = await self._db.all(
            "waits.waiting_runs",
            {
                "reason": reason,
                "due_before_ms": due_before_ms,
                "due_now": due_now,
                "cancel_requested": cancel_requested,
                "limit": limit,
            },
        )
        return [waiting_row(r) for r in rows]

    async def waiting_tree(
        self, run_id: str, *, include_detached: bool = False
    ) -> list[WaitingRow]:
        """What a run really waits on: its own wait, its attached children's, later rounds'."""
        rows = await self._db.all(
            "waits.waiting_tree", {"id": run_id, "include_detached": include_detached}
        )
        return [waiting_row(r) for r in rows]

    # ---- deferreds ---------------------------------------------------------

    async def complete_deferred(
        self, run_id: str, name: str, value: Any = None, metadata: Any = None
    ) -> Completion:
        """Record a completion, first writer wins; wake the run if it parked on it.

        A settled run takes nothing: AlreadyTerminal, no deferred row, no wake and no
        journal record. A late answer to a run that can never read it is not a receipt.
        """
        validate.identifier("deferred name", name)
        validate.json_value("value", value, self._settings.max_payload_bytes)
        validate.json_value("metadata", metadata, self._settings.max_payload_bytes)
        async with self._db.transaction():
            locked = await self._db.one("runs.get_for_update", {"id": run_id})
            if locked is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            current = run_row(locked)
            if current.status.terminal:
                return Completion(AlreadyTerminal(current), woke=False)
            row = await self._db.one(
                "waits.deferred_insert",
                {
                    "run_id": run_id,
                    "name": name,
                    "value": Json(value),  # kept verbatim: floats stay floats
                    "metadata": Jsonb(metadata),
                },
            )
            if row is None:
                existing = await self.deferred(run_id, name)
                assert existing is not None, "deferred vanished"
                return Completion(DeferredExisting(existing), woke=False)
            woke = await self._db.one("waits.wake_if_awaiting", {"run_id": run_id, "name": name})
            who = {k: metadata[k] for k in ("answered_by", "note") if k in (metadata or {})}
            await self._journal.record(
                run_id, Kind.DEFERRED_COMPLETED, {"name": name, "woke": woke is not None, **who}
            )
            return Completion(DeferredCompleted(deferred_row(row)), woke=woke is not None)

    async def deferred(self, run_id: str, name: str) -> DeferredRow | None:
        row = await self._db.one("waits.deferred_get", {"run_id": run_id, "name": name})
        return deferred_row(row) if row else None

    async def consume_deferred(self, run_id: str, name: str) -> bool:
        """Mark a completion observed (its row stays as replay evidence)."""
        return (
            await self._db.one("waits.deferred_consume", {"run_id": run_id, "name": name})
            is not None
        )

    async def completed_deferreds(self, run_id: str) -> list[DeferredRow]:
        rows = await self._db.all("waits.deferreds_completed", {"run_id": run_id})
        return [deferred_row(r) for r in rows]

    async def answer_event(
        self, run_id: str, name: str, value: Any = None, *, note: str | None = None
    ) -> Completion:
        """A producer's answer to ``ctx.wait_for(name)``; NotAnswerable for anything else.

        Decided by runfleet.answer (migration 0009) under the run's row lock, by what the
        run declared: the wait it is parked on (an ``event`` wait only) or a recorded
        ``event`` step of that name. A name the run has not reached yet may be answered
        early (first writer wins), unless it is in an internal namespace or an approval,
        child or timer of the run owns it. The answer is journaled with the authenticated
        role (``session_user``); ``note`` is the caller's words. The checks live in the
        database, not here, because producers may not write deferreds themselves: raw SQL
        with their credentials meets the same function.
        """
        validate.identifier("deferred name", name)
        if note is not None:
            validate.identifier("actor", note)
        validate.json_value("value", value, self._settings.max_payload_bytes)
        answered = await self._answer(run_id, name=name, value=value, note=note)
        assert answered is not None, "event answers always have an outcome"
        return answered

    async def answer_approval(
        self,
        run_id: str,
        token: str,
        *,
        approved: bool,
        value: Any = None,
        actor: str,
        reason: str | None = None,
    ) -> Completion | None:
        """Answer the approval a run is parked on; None if the token is not the pending one.

        The decision, who made it (the authenticated role; ``actor`` is kept as a note)
        and why are journaled by runfleet.answer in the statement that records it, so the
        answer and its audit trail cannot come apart.
        """
        validate.identifier("actor", actor)
        if not isinstance(token, str) or len(token) > validate.MAX_ID_LENGTH:
            raise InvalidInput("token", "must be a string of at most 255 characters")
        if not token or "\x00" in token or any(0xD800 <= ord(c) <= 0xDFFF for c in token):
            return None  # no issued token is empty or holds these: it cannot be the pending one
        validate.json_value("value", value, self._settings.max_payload_bytes)
        return await self._answer(
            run_id, token=token, approved=approved, value=value, note=actor, reason=reason
        )

    async def _answer(
        self,
        run_id: str,
        *,
        name: str = "",
        token: str | None = None,
        approved: bool = False,
        value: Any = None,
        note: str | None = None,
        reason: str | None = None,
    ) -> Completion | None:
        """``waits.answer``, its outcome turned into a Completion or a typed error."""
        seq = self._db.next_source_seq()
        self._db.next_source_seq()  # an approval journals two records: seq and seq + 1
        cap = self._settings.max_answers_per_run
        row = await self._db.one(
            "waits.answer",
            {
                "run_id": run_id,
                "name": name,
                "token": token,
                "approved": approved,
                "value": Json(value),  # kept verbatim: floats stay floats
                "note": note,
                "reason": reason,
                "max_answers": cap,
                "source_id": self._db.source_id,
                "source_seq": seq,
            },
        )
        assert row is not None, "runfleet.answer returns one row"
        outcome, target = AnswerOutcome(row["outcome"]), row["deferred_name"] or name
        if outcome is AnswerOutcome.NOT_FOUND:
            raise InvalidInput("run_id", f"run {run_id!r} does not exist")
        if outcome is AnswerOutcome.NOT_ANSWERABLE:
            raise NotAnswerable(run_id, target, _NOT_YOURS.get(row["why"] or "", _RUNFLEETS))
        if outcome is AnswerOutcome.LIMIT:
            raise LimitExceeded("max_answers_per_run", cap, f"run {run_id!r} took its answers")
        if outcome is AnswerOutcome.NO_MATCH:
            return None
        if outcome is AnswerOutcome.TERMINAL:
            settled = await self._db.one("runs.get", {"id": run_id})
            assert settled is not None, "a run seen settled vanished"
            return Completion(AlreadyTerminal(run_row(settled)), woke=False)
        written = await self.deferred(run_id, target)
        assert written is not None, "deferred vanished"
        if outcome is AnswerOutcome.EXISTING:
            return Completion(DeferredExisting(written), woke=False)
        return Completion(DeferredCompleted(written), woke=bool(row["woke"]))

    # ---- clocks ------------------------------------------------------------

    async def schedule_clock(
        self, run_id: str, name: str, deferred_name: str, due_at_ms: int, me: Owner, epoch: int
    ) -> ClockScheduled | ClockExisting | NotOwner | NotFound:
        """Owner-fenced; an existing clock wins, so a replayed sleep keeps its deadline."""
        validate.identifier("clock name", name)
        validate.identifier("deferred name", deferred_name)
        validate.finite_ms("due_at_ms", due_at_ms)
        async with self._db.transaction():
            row = await self._db.one(
                "waits.clock_insert",
                {
                    "run_id": run_id,
                    "name": name,
                    "deferred_name": deferred_name,
                    "due_at_ms": due_at_ms,
                    "epoch": epoch,
                    **owner_params(me),
                },
            )
            if row is not None:
                return ClockScheduled(clock_row(row))
            existing = await self.clock(run_id, name)
            if existing is not None:
                return ClockExisting(existing)
            run = await self._db.one("runs.get", {"id": run_id})
            return NotOwner(run_row(run)) if run else NotFound(run_id)

    async def clock(self, run_id: str, name: str) -> ClockRow | None:
        row = await self._db.one("waits.clock_get", {"run_id": run_id, "name": name})
        return clock_row(row) if row else None

    async def complete_clock(self, run_id: str, name: str) -> ClockFiring:
        """Fire a clock: complete it and its deferred in one transaction."""
        async with self._db.transaction():
            row = await self._db.one("waits.clock_complete", {"run_id": run_id, "name": name})
            if row is None:
                existing = await self.clock(run_id, name)
                outcome = ClockAlreadyCompleted(existing) if existing else NotFound(run_id)
                return ClockFiring(outcome, woke=False)
            fired = clock_row(row)
            done = await self.complete_deferred(
                run_id, fired.deferred_name, {"fired_at_ms": fired.completed_at_ms}
            )
            await self._journal.record(run_id, Kind.CLOCK_FIRED, {"clock": name})
            return ClockFiring(ClockCompleted(fired), woke=done.woke)

    async def due_clocks(self, limit: int = 64) -> list[ClockRow]:
        return [clock_row(r) for r in await self._db.all("waits.clocks_due", {"limit": limit})]

    async def pending_clocks(self, run_id: str) -> list[ClockRow]:
        rows = await self._db.all("waits.clocks_pending", {"run_id": run_id})
        return [clock_row(r) for r in rows]

    async def complete_run_clocks(self, run_id: str) -> int:
        return await self._db.execute("runs.close_clocks", {"ids": [run_id]})
