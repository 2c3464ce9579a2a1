"""Parks and wakes, deferred completions and durable clocks.

A park and a deferred completion both lock the run row first, so a completion
that commits before the park is seen by it (AlreadySatisfied) and one that
commits after it wakes the parked run: either way the completion is never lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Json, Jsonb

from store import validate
from store.config import Settings
from store.db import Database
from store.errors import InvalidInput
from store.journal import Journal, Kind
from store.rows import clock_row, deferred_row, owner_params, run_row, waiting_row
from store.types import (
    AlreadySatisfied,
    AlreadyTerminal,
    ClockAlreadyCompleted,
    ClockCompleted,
    ClockExisting,
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
    WaitingRow,
    WakeOutcome,
    Woken,
)

CHILD_DEFERRED = "child:"
"""Prefix of the deferred a parent awaits a child through (see waits.notify_parents)."""


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
        validate.identifier("waiting.reason", waiting.reason)
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
                    "reason": waiting.reason,
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
                    "reason": waiting.reason,
                    "wake_at_ms": waiting.wake_at_ms,
                    "token": waiting.token,
                    "deferred": deferred,
                    "epoch": epoch,
                },
            )
            return Parked(
                WaitingRow(
                    run_id, waiting.reason, waiting.wake_at_ms, waiting.token, waiting.request
                )
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
            await self._journal.record(
                run_id, Kind.DEFERRED_COMPLETED, {"name": name, "woke": woke is not None}
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

        The decision, who made it and why are journaled in the transaction that
        records it, so the answer and its audit trail cannot come apart.
        """
        validate.identifier("actor", actor)
        async with self._db.transaction():
            row = await self._db.one("waits.awaiting_token", {"id": run_id})
            if row is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            if row["waiting_reason"] != "approval" or row["waiting_token"] != token:
                return None
            decision = {"approved": approved, "value": value, "actor": actor, "reason": reason}
            done = await self.complete_deferred(run_id, row["waiting_deferred"], decision)
            await self._journal.record(
                run_id,
                Kind.APPROVAL_APPROVED if approved else Kind.APPROVAL_DENIED,
                {"token": token, "actor": actor, "reason": reason},
            )
            return done

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

    async def complete_clock(
        self, run_id: str, name: str
    ) -> tuple[ClockCompleted | ClockAlreadyCompleted | NotFound, bool]:
        """Fire a clock: complete it and its deferred in one transaction.

        Returns the outcome and whether the run's wait was cleared (send a wake).
        """
        async with self._db.transaction():
            row = await self._db.one("waits.clock_complete", {"run_id": run_id, "name": name})
            if row is None:
                existing = await self.clock(run_id, name)
                return (ClockAlreadyCompleted(existing) if existing else NotFound(run_id)), False
            fired = clock_row(row)
            done = await self.complete_deferred(
                run_id, fired.deferred_name, {"fired_at_ms": fired.completed_at_ms}
            )
            await self._journal.record(run_id, Kind.CLOCK_FIRED, {"clock": name})
            return ClockCompleted(fired), done.woke

    async def due_clocks(self, limit: int = 64) -> list[ClockRow]:
        return [clock_row(r) for r in await self._db.all("waits.clocks_due", {"limit": limit})]

    async def pending_clocks(self, run_id: str) -> list[ClockRow]:
        rows = await self._db.all("waits.clocks_pending", {"run_id": run_id})
        return [clock_row(r) for r in rows]

    async def complete_run_clocks(self, run_id: str) -> int:
        return await self._db.execute("runs.close_clocks", {"ids": [run_id]})
