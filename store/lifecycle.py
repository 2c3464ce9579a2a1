"""Owned transitions and cancellation: how a run leaves ``running`` and how it ends.

A settlement and everything it implies — journal record, the run's clocks closed,
its attached descendants cancelled — commit in one transaction or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.settlements as settlements
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.admit import Admission
from runfleet.store.config import Settings
from runfleet.store.dag import Dag
from runfleet.store.db import Database, LockWaitEnded
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Journal, digest
from runfleet.store.rows import owner_params, run_row
from runfleet.store.types.outcomes import (
    AlreadyRequested,
    AlreadyTerminal,
    CancelOutcome,
    CancelRequested,
    CheckedSettle,
    GuardFailed,
    NotFound,
    NotOwner,
    RowLocked,
    Settle,
    Transitioned,
    TransitionOutcome,
)
from runfleet.store.types.run import NewRun, Owner, RunRow, RunStatus, Waiting, canonical_json


@dataclass(frozen=True, slots=True)
class HandOff:
    """What ``Lifecycle.hand_off`` did: the round's own settlement outcome, and the next
    round as admitted when that settlement won (None otherwise: nothing was written)."""

    outcome: TransitionOutcome
    successor: RunRow | None


class Lifecycle:
    def __init__(
        self, db: Database, journal: Journal, settings: Settings, admission: Admission, dag: Dag
    ) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings
        self._admission = admission
        self._dag = dag

    async def hand_off(self, run_id: str, me: Owner, epoch: int, successor: NewRun) -> HandOff:
        """Settle round ``run_id`` completed and admit ``successor`` in one transaction.

        Both or neither: the round settles ``completed`` with ``handed_off_to`` and a
        ``handed-off`` record naming the successor and its round, without ending its
        children (the lineage, and so the parent they belong to, carries on).
        ExecutionIdentityConflict (the successor's id taken by a different run) rolls the
        settlement back too.
        """
        async with self._db.transaction():
            outcome = await self.transition_owned(
                run_id,
                me,
                epoch,
                RunStatus.COMPLETED,
                state_patch={"handed_off_to": successor.id},
                record=jr.HandedOff(successor=successor.id, round=successor.round_ordinal),
                end_children=False,
            )
            if not isinstance(outcome, Transitioned):
                return HandOff(outcome, None)
            created = await self._admission.create(successor)
            return HandOff(outcome, created.row)

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
        record: jr.Settled | None = None,
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
        canonical text in the ``result`` column (``store.values``), so ``wait()``
        hands back exactly the value the flow returned, floats and big ints included.
        A patch that cannot be stored raises UnstorableValue and writes nothing.

        ``record`` is the journal record (its kind its type's), a plain ``transitioned``
        when None; its ``to`` and ``epoch`` are this transition's.
        """
        to_status = validate.status(to_status, "to_status")
        if to_status is RunStatus.RUNNING or to_status is RunStatus.PENDING:
            raise InvalidInput("to_status", f"an owned run cannot transition to {to_status}")
        if (to_status is RunStatus.SUSPENDED) != (waiting is not None):
            raise InvalidInput("waiting", "a suspended run needs a waiting reason, others none")
        record = jr.settled_record(record, to_status, epoch)
        patch, result, payload = self._encode(state_patch, record)
        params = {
            "id": run_id,
            "epoch": epoch,
            "to_status": to_status.value,
            "state_patch": Jsonb(patch),
            "result": result,
            "guard": guard,
            "waiting_reason": waiting.reason if waiting else None,
            "waiting_wake_at_ms": waiting.wake_at_ms if waiting else None,
            "waiting_token": waiting.token if waiting else None,
            "waiting_request": Jsonb(waiting.request)
            if waiting is not None and waiting.request is not None
            else None,
            "waiting_deferred": None,
            "kind": record.KIND.value,
            "source_id": self._db.source_id,
            "source_seq": self._db.next_source_seq(),
            "payload": Jsonb(payload),
            "digest": digest(payload),
            **owner_params(me),
        }
        if not to_status.terminal:  # one statement: the CAS and its record
            row = await self._transition("runs.transition_owned", params)
            if row is None:
                return await self._refusal(run_id, me, epoch)
            return Transitioned(run_row(row))
        async with self._db.transaction():
            row = await self._transition("runs.transition_owned", params)
            if row is None:
                return await self._refusal(run_id, me, epoch)
            moved = run_row(row)
            # Statements of their own (fresh snapshots, after the row lock was won):
            # a child admitted just before this settlement must be seen and cancelled.
            cascaded: list[str] = []
            if end_children:
                cascaded = await self._cascade(run_id, cause=jr.cascade_cause(to_status))
            woke = await self._dag.notify_parents([moved])
            return Transitioned(moved, tuple(cascaded), tuple(woke.get(run_id, ())))

    def _encode(
        self, state_patch: dict[str, Any] | None, record: jr.Settled
    ) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
        """(state patch, canonical result text or None, journal payload); UnstorableValue
        when the patch cannot be stored (nothing is written then)."""
        patch, _, result = self._texts(state_patch)
        return patch, result, record.dump()

    def _texts(self, state_patch: dict[str, Any] | None) -> tuple[dict[str, Any], str, str | None]:
        """(the patch without its ``result``, that patch's canonical text, the result's
        canonical text or None); UnstorableValue when either cannot be stored."""
        patch = dict(state_patch or {})
        limit = self._settings.max_payload_bytes
        result = None
        if "result" in patch:
            result = values.encode_canonical(patch.pop("result"), limit, "state", ["result"])
        return patch, values.encode_canonical(patch, limit, "state"), result

    async def settle(self, me: Owner, item: Settle) -> TransitionOutcome | RowLocked:
        """Commit one ending (``store.settlements`` builds each) with ``transition_owned``'s
        rules: fenced by ``me`` and the item's epoch, cancel-guarded when ``guard``.

        ``RowLocked`` when another transaction held the run's row past the store's lock
        bound (its producer may lock it; ``store.db.LockWaitEnded``): nothing was written,
        the caller tries again later."""
        try:
            return await self.transition_owned(
                item.run_id,
                me,
                item.epoch,
                item.status,
                state_patch=item.patch,
                guard=item.guard,
                record=item.record,
            )
        except LockWaitEnded:
            current = await self._get(item.run_id)
            return NotFound(item.run_id) if current is None else RowLocked(current)

    def check(self, item: Settle) -> CheckedSettle:
        """``item`` encoded for ``settle_many``; UnstorableValue now if it could not be stored.

        A caller that batches settlements checks each one first, so an unstorable value
        fails its own run alone, and hands the batch the result: nothing is encoded twice.
        """
        record = settlements.journaled(item)
        _, patch_text, result = self._texts(item.patch)
        payload = canonical_json(record.dump())
        return CheckedSettle(item, record, patch_text, result, payload, values.text_digest(payload))

    async def settle_many(
        self, me: Owner, batch: Sequence[Settle | CheckedSettle]
    ) -> list[TransitionOutcome | RowLocked]:
        """Commit a batch of terminal settlements ``me`` owns in one transaction.

        Each item keeps ``transition_owned``'s rules and answers its own outcome, in
        order: Transitioned (with the descendants it asked to cancel and the parents it
        woke), GuardFailed when a cancel request landed first, NotOwner/NotFound when the
        fence was lost. The settlements, their records and clocks are one statement, the
        children walk and the parents' wake-ups one more each: a batch of any size costs
        the round trips of one settlement. A batch with nothing to hand over (no parent on
        any run's lineage, no open attached descendant) is that one statement alone,
        autocommitted (``runs.settle_alone``); one that has is undone inside the
        statement and settled again the long way. A value that cannot be stored raises
        UnstorableValue for the whole batch and writes nothing (``check`` each item first,
        and pass what it answered: the batch then encodes nothing again). The batch never
        waits on a row lock: a run whose row another transaction holds (a producer may
        lock its own run's row) is left out and answered ``RowLocked``, for the caller to
        settle alone (``settle``), so one locked row never holds the others.
        """
        if not batch:
            return []
        items = [b.item if isinstance(b, CheckedSettle) else b for b in batch]
        if len({item.run_id for item in items}) != len(items):
            raise InvalidInput("items", "a batch settles each run once")
        statuses = [validate.status(item.status, "status") for item in items]
        for status in statuses:
            if not status.terminal:
                raise InvalidInput("status", f"settle_many settles runs, not {status}")
        checked = [b if isinstance(b, CheckedSettle) else self.check(b) for b in batch]
        params = {
            "ids": [item.run_id for item in items],
            "epochs": [item.epoch for item in items],
            "statuses": [status.value for status in statuses],
            "patches": [c.patch for c in checked],  # canonical texts, cast to jsonb in SQL
            "results": [c.result for c in checked],
            "guards": [item.guard for item in items],
            "kinds": [c.record.KIND.value for c in checked],
            "seqs": [self._db.next_source_seq() for _ in items],
            "payloads": [c.payload for c in checked],
            "digests": [c.digest for c in checked],
            "source_id": self._db.source_id,
            **owner_params(me),
        }
        alone = await self._settle_alone(params)
        if alone is not None:
            return await self._settle_outcomes(me, items, alone, {}, {})
        async with self._db.transaction():
            rows = await self._transition_all("runs.settle_many", params)
            moved = {row["id"]: run_row(row) for row in rows}
            cascaded: dict[str, list[str]] = {}
            if moved:
                # As in transition_owned: fresh statements after the row locks were won.
                pairs = await self._db.all("runs.attached_descendants_many", {"ids": list(moved)})
                for root in dict.fromkeys(str(p["root"]) for p in pairs):
                    cause = jr.cascade_cause(moved[root].status)
                    cascaded[root] = await self._cascade(root, cause=cause)
            woke = await self._dag.notify_parents(list(moved.values()))
            return await self._settle_outcomes(me, items, moved, cascaded, woke)

    async def _settle_alone(self, params: dict[str, Any]) -> dict[str, RunRow] | None:
        """The batch settled by one autocommitted statement, the rows it moved by id; None
        when it hands over to parents or descendants (nothing was written)."""
        rows = await self._transition_all("runs.settle_alone", params)
        if any(row["refused"] for row in rows):
            return None
        return {row["id"]: run_row(row) for row in rows}

    async def _settle_outcomes(
        self,
        me: Owner,
        items: Sequence[Settle],
        moved: dict[str, RunRow],
        cascaded: dict[str, list[str]],
        woke: dict[str, list[RunRow]],
    ) -> list[TransitionOutcome | RowLocked]:
        """Each item's outcome, in order; an item not moved is read to say why."""
        outcomes: list[TransitionOutcome | RowLocked] = []
        for item in items:
            done = moved.get(item.run_id)
            if done is None:
                refused = await self._refusal(item.run_id, me, item.epoch)
                if isinstance(refused, NotOwner) and _owned(refused.current, me, item.epoch):
                    # Still ours, no cancel asked: only a row lock held elsewhere (SKIP LOCKED)
                    outcomes.append(RowLocked(refused.current))
                else:
                    outcomes.append(refused)
                continue
            outcomes.append(
                Transitioned(
                    done,
                    tuple(cascaded.get(item.run_id, ())),
                    tuple(woke.get(item.run_id, ())),
                )
            )
        return outcomes

    async def _transition(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """One transition statement; data Postgres refuses is UnstorableValue, not a retry."""
        rows = await self._transition_all(name, params)
        return rows[0] if rows else None

    async def _transition_all(self, name: str, params: dict[str, Any]) -> list[Any]:
        try:
            return await self._db.all(name, params)
        except psycopg.Error as exc:
            if values.refused_by_database(exc):
                raise values.UnstorableValue("state", f"Postgres refused it: {exc}") from exc
            raise

    async def _refusal(self, run_id: str, me: Owner, epoch: int) -> TransitionOutcome:
        current = await self._get(run_id)
        if current is None:
            return NotFound(run_id)
        if _owned(current, me, epoch) and current.cancel_requested_at_ms is not None:
            return GuardFailed(current)
        return NotOwner(current)

    async def _cascade(self, run_id: str, *, cause: jr.CascadeCause) -> list[str]:
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
            payload = jr.CancelRequested(actor=row["session_role"], cause=cause, by=run_id)
            await self._journal.record(row["id"], payload)
        applied = jr.ChildPolicyApplied(cause=cause, cascaded_to=ids)
        await self._journal.record(run_id, applied)
        return ids

    async def rounds(self, run_id: str) -> list[RunRow]:
        """Every round of ``run_id``'s lineage, oldest first (empty if the run is unknown)."""
        return [run_row(r) for r in await self._db.all("runs.lineage_rounds", {"id": run_id})]

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
                    jr.CancelRequested(
                        actor=round_row_role[round_row.id],
                        note=note,
                        reason=reason,
                        status=round_row.status.value,
                        via=None if round_row.id == run_id else run_id,
                    ),
                )
            cascaded = await self._cascade(run_id, cause=jr.CascadeCause.PARENT_CANCELLED)
            target = max(requested, key=lambda r: r.round_ordinal)
            return CancelRequested(target, tuple(r.id for r in requested), tuple(cascaded))

    async def acknowledge_cancel(
        self, run_id: str, me: Owner, epoch: int, *, found_at: str | None = None
    ) -> TransitionOutcome | RowLocked:
        """The owner closes a run as cancelled: cascade, clocks and record included
        (``found_at``: the interrupt whose release found the request, as in
        ``settlements.cancelled``)."""
        return await self.settle(me, settlements.cancelled(run_id, epoch, me, found_at=found_at))


def _owned(row: RunRow, me: Owner, epoch: int) -> bool:
    """``row`` is running under ``me`` at ``epoch``: the fence a settlement needs."""
    return row.status is RunStatus.RUNNING and row.owner == me and row.epoch == epoch
