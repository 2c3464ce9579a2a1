"""Owned transitions and cancellation: how a run leaves ``running`` and how it ends.

A settlement and everything it implies — journal record, the run's clocks closed,
its attached descendants cancelled — commit in one transaction or not at all.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Json, Jsonb

from store import validate, values
from store.config import Settings
from store.db import Database
from store.errors import InvalidInput
from store.journal import Journal, Kind, digest
from store.rows import owner_params, run_row
from store.types import (
    AlreadyRequested,
    AlreadyTerminal,
    CancelOutcome,
    CancelRequested,
    GuardFailed,
    NotFound,
    NotOwner,
    Owner,
    RunRow,
    RunStatus,
    Transitioned,
    TransitionOutcome,
    Waiting,
)


class Lifecycle:
    def __init__(self, db: Database, journal: Journal, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings

    async def _get(self, run_id: str) -> RunRow | None:
        row = await self._db.one("runs.get", {"id": run_id})
        return run_row(row) if row else None

    async def transition_owned(
        self,
        run_id: str,
        me: Owner,
        epoch: int,
        to_status: RunStatus,
        *,
        state_patch: dict[str, Any] | None = None,
        guard: bool = True,
        waiting: Waiting | None = None,
        kind: str = Kind.TRANSITIONED,
        record: dict[str, Any] | None = None,
        end_children: bool = True,
    ) -> TransitionOutcome:
        """Move a run ``me`` owns at ``epoch`` out of ``running``.

        A terminal status ends the attached children of every round of the lineage
        (each is asked to cancel and closes through its own cancel path) unless
        ``end_children`` is off: a round that HANDS OFF settles ``completed`` but the
        lineage, and so the parent its children belong to, carries on.

        With ``guard`` (the default) a cancel request that landed first turns the
        write into GuardFailed and the caller must cancel instead: a run is never
        both cancelled and completed.

        A ``result`` key in ``state_patch`` is the run's result: it is stored as its
        canonical text in the ``result`` column (``store.values``), so ``result()``
        hands back exactly the value the flow returned, floats and big ints included.
        A patch that cannot be stored raises UnstorableValue and writes nothing.
        """
        to_status = validate.status(to_status, "to_status")
        if to_status is RunStatus.RUNNING or to_status is RunStatus.PENDING:
            raise InvalidInput("to_status", f"an owned run cannot transition to {to_status}")
        if (to_status is RunStatus.SUSPENDED) != (waiting is not None):
            raise InvalidInput("waiting", "a suspended run needs a waiting reason, others none")
        patch = dict(state_patch or {})
        limit = self._settings.max_payload_bytes
        result = None
        if "result" in patch:
            result = values.encode_canonical(patch.pop("result"), limit, "state", ["result"])
        values.encode_canonical(patch, limit, "state")
        w = waiting or Waiting(reason="")
        payload = {"to": to_status.value, "epoch": epoch, **(record or {})}
        params = {
            "id": run_id,
            "epoch": epoch,
            "to_status": to_status.value,
            "state_patch": Jsonb(patch),
            "result": result,
            "guard": guard,
            "waiting_reason": waiting.reason if waiting else None,
            "waiting_wake_at_ms": w.wake_at_ms,
            "waiting_token": w.token,
            "waiting_request": Jsonb(w.request) if w.request is not None else None,
            "waiting_deferred": None,
            "kind": kind,
            "source_id": self._db.source_id,
            "source_seq": self._db.next_source_seq(),
            "payload": Jsonb(payload),
            "digest": digest(payload),
            **owner_params(me),
        }
        if not to_status.terminal:  # one statement: the CAS and its record
            row = await self._transition(params)
            if row is None:
                return await self._refusal(run_id, me, epoch)
            return Transitioned(run_row(row))
        async with self._db.transaction():
            row = await self._transition(params)
            if row is None:
                return await self._refusal(run_id, me, epoch)
            moved = run_row(row)
            # Statements of their own (fresh snapshots, after the row lock was won):
            # a child admitted just before this settlement must be seen and cancelled.
            cascaded: list[str] = []
            if end_children:
                cascaded = await self._cascade(run_id, cause=f"parent-{to_status.value}")
            woke = await self.notify_parents(moved)
            return Transitioned(moved, tuple(cascaded), tuple(woke))

    async def _transition(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """``runs.transition_owned``; data Postgres refuses is UnstorableValue, not a retry."""
        try:
            return await self._db.one("runs.transition_owned", params)
        except psycopg.Error as exc:
            if values.refused_by_database(exc):
                raise values.UnstorableValue("state", f"Postgres refused it: {exc}") from exc
            raise

    async def _refusal(self, run_id: str, me: Owner, epoch: int) -> TransitionOutcome:
        current = await self._get(run_id)
        if current is None:
            return NotFound(run_id)
        owned = (
            current.status is RunStatus.RUNNING and current.owner == me and current.epoch == epoch
        )
        if owned and current.cancel_requested_at_ms is not None:
            return GuardFailed(current)
        return NotOwner(current)

    async def _cascade(self, run_id: str, *, cause: str) -> list[str]:
        """Ask every unsettled attached descendant of the lineage to cancel; journal it.

        Only the request is written (first writer wins): each descendant is then closed
        by whoever drives it, through the ordinary cancel path, so a parked child's
        compensations run as if it had been cancelled itself. The walk has no depth cap.
        """
        rows = await self._db.all("runs.attached_descendants", {"id": run_id})
        ids = [r["id"] for r in rows]
        if not ids:
            return []
        asked = await self._db.all("runs.cascade_cancel", {"ids": ids, "parent": run_id})
        for row in sorted(asked, key=lambda r: str(r["id"])):
            payload = {"actor": row["session_role"], "cause": cause, "by": run_id}
            await self._journal.record(row["id"], Kind.CANCEL_REQUESTED, payload)
        await self._journal.record(
            run_id, Kind.CHILD_POLICY_APPLIED, {"cause": cause, "cascaded_to": ids}
        )
        return ids

    async def rounds(self, run_id: str) -> list[RunRow]:
        """Every round of ``run_id``'s lineage, oldest first (empty if the run is unknown)."""
        return [run_row(r) for r in await self._db.all("runs.lineage_rounds", {"id": run_id})]

    async def notify_parents(self, child: RunRow) -> list[str]:
        """Hand a settled child's outcome to every parent; the ids of parents it woke."""
        value = {
            "status": child.status.value,
            "result": child.state.get("result"),
            "error": child.state.get("error"),
            "handed_off_to": child.state.get("handed_off_to"),
        }
        # Json, not Jsonb: the deferred keeps the result's exact text (floats stay floats).
        rows = await self._db.all("waits.notify_parents", {"child": child.id, "value": Json(value)})
        return [r["id"] for r in rows]

    async def request_cancel(
        self, run_id: str, *, note: str | None = None, reason: str | None = None
    ) -> CancelOutcome:
        """Durably ask for a logical run's cancellation (first writer wins), from anywhere.

        Every unsettled round of the lineage gets the request, so cancelling the id a
        producer holds reaches the round live now, whatever it handed off to. Attached
        descendants of every round are asked in the same transaction; each is closed by
        its own cancel path (compensations included), as is the run itself.

        The request is journaled with the authenticated role (``session_user``, read by
        the UPDATE that asks) as its ``actor``: who asked is Postgres's word, not the
        caller's. ``note`` is the caller's own words (an operator's name, ``deadline``).
        """
        validate.identifier("run_id", run_id)
        if note is not None:
            validate.identifier("actor", note)  # the Queue API's name for it
        async with self._db.transaction():
            requested: list[RunRow] = []
            round_row_role: dict[str, str] = {}  # who asked each round: session_user
            stuck: set[str] = set()
            while True:
                rows = await self._db.all("runs.request_cancel", {"id": run_id})
                requested += [run_row(r) for r in rows]
                round_row_role.update((r["id"], r["session_role"]) for r in rows)
                # A handoff that committed while the UPDATE waited on the old round's
                # lock left a successor its snapshot could not see: a fresh read finds it.
                rounds = await self.rounds(run_id)
                unasked = {
                    r.id
                    for r in rounds
                    if not r.status.terminal and r.cancel_requested_at_ms is None
                }
                if not unasked or (not rows and unasked == stuck):
                    break  # done, or no progress possible (never spin)
                stuck = unasked
            if not requested:
                if not rounds:
                    return NotFound(run_id)
                live = [r for r in rounds if not r.status.terminal]
                if not live:
                    return AlreadyTerminal(next(r for r in rounds if r.id == run_id))
                return AlreadyRequested(live[-1])
            for round_row in requested:
                await self._journal.record(
                    round_row.id,
                    Kind.CANCEL_REQUESTED,
                    {
                        "actor": round_row_role[round_row.id],
                        "note": note,
                        "reason": reason,
                        "status": round_row.status.value,
                        **({} if round_row.id == run_id else {"via": run_id}),
                    },
                )
            cascaded = await self._cascade(run_id, cause="parent-cancelled")
            target = max(requested, key=lambda r: r.round_ordinal)
            return CancelRequested(target, tuple(r.id for r in requested), tuple(cascaded))

    async def acknowledge_cancel(
        self, run_id: str, me: Owner, epoch: int, *, record: dict[str, Any] | None = None
    ) -> TransitionOutcome:
        """The owner closes a run as cancelled: cascade, clocks and record included."""
        return await self.transition_owned(
            run_id,
            me,
            epoch,
            RunStatus.CANCELLED,
            state_patch={"cancellation": {"acknowledged_by": me.key, **(record or {})}},
            guard=False,
            kind=Kind.INTERRUPTED,
            record={"cancelled": True, **(record or {})},
        )
