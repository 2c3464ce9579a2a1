"""Parks and wakes, durable clocks and approval tokens; deferreds are ``store.deferreds``.

A park and a deferred completion both lock the run row first, so a completion
that commits before the park is seen by it (AlreadySatisfied) and one that
commits after it wakes the parked run: either way the completion is never lost.
"""

from __future__ import annotations

import hashlib
from typing import Any

from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
from runfleet.store.config import Settings
from runfleet.store.db import Database, LockWaitEnded
from runfleet.store.deferreds import Deferreds
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Journal, Kind
from runfleet.store.rows import clock_row, owner_params, run_row, waiting_row
from runfleet.store.types.outcomes import (
    AlreadySatisfied,
    GuardFailed,
    NotFound,
    NotOwner,
    NotWaiting,
    Parked,
    ParkOutcome,
    RowLocked,
    WakeOutcome,
    Woken,
)
from runfleet.store.types.run import Owner, RunStatus, Waiting, WaitingReason, WaitingRow
from runfleet.store.types.waits import (
    ClockAlreadyCompleted,
    ClockCompleted,
    ClockExisting,
    ClockFiring,
    ClockRow,
    ClockScheduled,
)

CHILD_DEFERRED = "child:"
"""Prefix of the deferred a parent awaits a child through (see waits.notify_parents)."""

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
    approval = payload.get("reason") == WaitingReason.APPROVAL
    if kind in (Kind.APPROVAL_APPROVED, Kind.APPROVAL_DENIED) or approval:
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


class Waits:
    """Parks, wakes and clocks; deferred completions and answers (``complete_deferred``,
    ``deferred``, ``answer_event``, ``answer_approval``, …) are ``store.deferreds``, which
    a park reads and a clock's firing writes through."""

    def __init__(
        self, db: Database, journal: Journal, settings: Settings, deferreds: Deferreds
    ) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings
        self._deferreds = deferreds

    # ---- park / wake -------------------------------------------------------

    async def release(
        self,
        run_id: str,
        me: Owner,
        epoch: int,
        cause: jr.ReleaseCause,
        detail: str,
        *,
        guard: bool = True,
        unconfirmed_ms: int | None = None,
    ) -> ParkOutcome | RowLocked:
        """Hand a run ``me`` owns back unsettled (shutdown, lapse, a failed drive): park it
        ``released`` and journal why, in one transaction. Parked, or NotOwner/NotFound when
        the fence was already gone; ``RowLocked`` when another transaction held the row
        past the store's lock bound (``store.db.LockWaitEnded``): nothing was written.

        With ``guard``, the row's cancel request decides, not the caller's cause: a cancel
        committed before the release (and not yet delivered to the body) refuses it with
        GuardFailed, checked under the row lock with the fence, so the caller — which still
        holds the run at ``epoch`` — cancels it instead of handing it to another worker.
        ``unconfirmed_ms`` (a lapse's release): how long the lease went unconfirmed."""
        try:
            return await self._release(run_id, me, epoch, cause, detail, guard, unconfirmed_ms)
        except LockWaitEnded:
            row = await self._db.one("runs.get", {"id": run_id})
            return NotFound(run_id) if row is None else RowLocked(run_row(row))

    async def _release(
        self,
        run_id: str,
        me: Owner,
        epoch: int,
        cause: jr.ReleaseCause,
        detail: str,
        guard: bool,
        unconfirmed_ms: int | None,
    ) -> ParkOutcome:
        async with self._db.transaction():
            outcome = await self.park(
                run_id, me, epoch, Waiting(reason=WaitingReason.RELEASED), guard=guard
            )
            if isinstance(outcome, Parked):
                record = jr.InterruptReleased(
                    cause=cause,
                    detail=detail,
                    owner=me.key,
                    epoch=epoch,
                    unconfirmed_ms=unconfirmed_ms,
                )
                await self._journal.record(run_id, record)
            return outcome

    async def quarantine(
        self, run_id: str, me: Owner, epoch: int, problem: jr.Quarantined
    ) -> ParkOutcome:
        """A recorded output of step ``problem.key`` no longer matches its digest: journal
        the problem (owner-fenced) and park the run for an operator's decision (the
        problem as the wait's request), in one transaction. The record stays even when a
        cancel request refuses the park."""
        key = problem.key
        if key is None:
            raise InvalidInput("problem", "a quarantine names the step it found")
        async with self._db.transaction():
            await self._journal.emit_owned(run_id, me, epoch, problem)
            return await self.park(
                run_id,
                me,
                epoch,
                Waiting(reason=WaitingReason.QUARANTINE, token=key, request=problem.dump()),
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
            if (
                deferred is not None
                and await self._deferreds.deferred(run_id, deferred) is not None
            ):
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
                jr.Parked(
                    reason=reason,
                    wake_at_ms=waiting.wake_at_ms,
                    token=waiting.token,
                    deferred=deferred,
                    epoch=epoch,
                ),
            )
            return Parked(
                WaitingRow(run_id, reason, waiting.wake_at_ms, waiting.token, waiting.request)
            )

    async def wake(self, run_id: str, *, cause: jr.WakeCause = jr.WakeCause.WAKE) -> WakeOutcome:
        """Clear a run's wait so the claim path can resume it (idempotent)."""
        async with self._db.transaction():
            row = await self._db.one("waits.wake", {"id": run_id})
            if row is None:
                exists = await self._db.one("runs.get", {"id": run_id})
                return NotWaiting(run_id) if exists else NotFound(run_id)
            woken = waiting_row(row)
            record = jr.Woken(reason=woken.reason, cause=cause)
            await self._journal.record(run_id, record)
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
            done = await self._deferreds.complete_deferred(
                run_id, fired.deferred_name, {"fired_at_ms": fired.completed_at_ms}
            )
            await self._journal.record(run_id, jr.ClockFired(clock=name))
            return ClockFiring(ClockCompleted(fired), woke=done.woke)

    async def due_clocks(self, limit: int = 64) -> list[ClockRow]:
        return [clock_row(r) for r in await self._db.all("waits.clocks_due", {"limit": limit})]

    async def pending_clocks(self, run_id: str) -> list[ClockRow]:
        rows = await self._db.all("waits.clocks_pending", {"run_id": run_id})
        return [clock_row(r) for r in rows]

    async def complete_run_clocks(self, run_id: str) -> int:
        return await self._db.execute("runs.close_clocks", {"ids": [run_id]})
