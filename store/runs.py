"""Run admission, reads, and the claim / activate / steal compare-and-swap family.

Each CAS states its full precondition in SQL and writes its journal record in the
same transaction; zero rows updated is reported as the outcome that explains why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from store import validate, values
from store.config import Settings
from store.dag import Dag
from store.db import Database
from store.errors import ExecutionIdentityConflict, InvalidInput
from store.journal import Journal, Kind
from store.rows import owner_params, run_row
from store.types import (
    Activated,
    ActivateOutcome,
    Claimed,
    ClaimOutcome,
    ClaimRecovered,
    Created,
    CreateOutcome,
    Heartbeat,
    Joined,
    LeaseFresh,
    NewRun,
    NotFound,
    OnParentExit,
    Owner,
    RunRow,
    RunStatus,
    Snapshot,
    SnapshotChanged,
    StealOutcome,
    Stolen,
    canonical_json,
)


def _expected(expected: Snapshot) -> dict[str, Any]:
    owner = expected.owner
    return {
        "status": expected.status.value,
        "exp_owner_host": owner.host_id if owner else None,
        "exp_owner_pid": owner.pid if owner else None,
        "exp_owner_nonce": owner.nonce if owner else None,
        "exp_heartbeat_at_ms": expected.heartbeat_at_ms,
        "exp_epoch": expected.epoch,
    }


def _same(current: Snapshot, expected: Snapshot) -> bool:
    """Whether nothing the caller's snapshot names has moved (its epoch only if it has one)."""
    if expected.epoch is None:
        current = replace(current, epoch=None)
    return current == expected


def _identity(row: RunRow) -> list[tuple[str, Any]]:
    return [
        ("flow", row.flow),
        ("payload", row.payload),
        ("scopes", sorted(row.scopes)),
        ("lineage_id", row.lineage_id),
        ("round_ordinal", row.round_ordinal),
        ("parent", row.state.get("parent")),
    ]


class Runs:
    def __init__(self, db: Database, journal: Journal, dag: Dag, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._dag = dag
        self._settings = settings

    # ---- reads -------------------------------------------------------------

    async def get(self, run_id: str) -> RunRow | None:
        row = await self._db.one("runs.get", {"id": run_id})
        return run_row(row) if row else None

    async def get_many(self, run_ids: list[str]) -> list[RunRow]:
        return [run_row(r) for r in await self._db.all("runs.get_many", {"ids": run_ids})]

    async def get_for_update(self, run_id: str) -> RunRow | None:
        """Read and lock the row until the enclosing transaction ends."""
        row = await self._db.one("runs.get_for_update", {"id": run_id})
        return run_row(row) if row else None

    async def latest_round(self, lineage_id: str) -> RunRow | None:
        row = await self._db.one("runs.latest_round", {"lineage_id": lineage_id})
        return run_row(row) if row else None

    # ---- admission ---------------------------------------------------------

    def _state(self, new: NewRun) -> dict[str, Any]:
        state: dict[str, Any] = dict(new.extra)
        state.pop("payload", None)  # the payload has its own column (see _insert_params)
        state.update(
            scopes=sorted(set(new.scopes)),
            parent=new.parent_id,
            on_parent_exit=new.on_parent_exit.value,
            max_rounds=new.max_rounds,
            deadline_ms=new.deadline_ms,
        )
        if new.timeout_ms is not None:
            del state["deadline_ms"]  # set from the database clock at insert
        return state

    def _validate(self, new: NewRun) -> None:
        validate.identifier("run_id", new.id)
        validate.identifier("flow", new.flow)
        validate.identifier("queue", new.queue)
        validate.json_value("extra", new.extra, self._settings.max_payload_bytes)
        for scope in new.scopes:
            validate.identifier("scopes", scope)
        if new.parent_id is not None:
            validate.identifier("parent_id", new.parent_id)
            if new.parent_id == new.id:
                raise InvalidInput("parent_id", "a run cannot be its own parent")
        if new.lineage_id is not None:
            validate.identifier("lineage_id", new.lineage_id)
        if new.round_ordinal < 0:
            raise InvalidInput("round_ordinal", "must be >= 0")
        if new.max_rounds is not None and new.max_rounds < 1:
            raise InvalidInput("max_rounds", "must be >= 1 when given")

    def _insert_params(
        self, news: Sequence[NewRun], states: Sequence[dict[str, Any]], inherit: bool
    ) -> dict[str, Any]:
        """``runs.insert``'s parallel arrays for a batch of admissions.

        The payload goes in as its canonical text (``store.values``), so the flow's
        arguments come back exactly as the producer gave them (``1e16`` stays a float);
        a payload that cannot be stored raises UnstorableValue (field ``payload``).
        """
        limit = self._settings.max_payload_bytes
        return {
            "id": [n.id for n in news],
            "flow": [n.flow for n in news],
            "queue": [n.queue for n in news],
            "state": [Jsonb(state) for state in states],
            "payload": [values.encode_canonical(n.payload, limit, "payload") for n in news],
            "lineage_id": [n.lineage_id or n.id for n in news],
            "round_ordinal": [n.round_ordinal for n in news],
            "previous_round_id": [n.previous_round_id for n in news],
            "inherit_cancel": [inherit for _ in news],
            "delay_until_ms": [n.delay_until_ms for n in news],
            "timeout_ms": [n.timeout_ms for n in news],
        }

    async def _joined(self, new: NewRun, state: dict[str, Any]) -> Joined:
        """The insert found the id taken: join the run if its identity matches ours."""
        existing = await self.get(new.id)
        if existing is None:
            # Lost on (lineage_id, round_ordinal), or the id belongs to a run row-level
            # security hides from this role: say only that it is taken, nothing about it.
            raise InvalidInput(
                "run_id" if new.lineage_id in (None, new.id) else "round_ordinal",
                f"run id {new.id!r} or round {new.round_ordinal} of lineage"
                f" {new.lineage_id or new.id!r} already belongs to another run",
            )
        self._check_identity(existing, new, state)
        return Joined(existing)

    async def _insert(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """``runs.insert``; data Postgres refuses (a lone surrogate in a payload: jsonb
        rejects the escape) is UnstorableValue, a caller's error, never a retry."""
        try:
            return await self._db.all("runs.insert", params)
        except psycopg.Error as exc:
            if values.refused_by_database(exc):
                raise values.UnstorableValue("payload", f"Postgres refused it: {exc}") from exc
            raise

    @staticmethod
    def _created_record(new: NewRun, inherit: bool) -> dict[str, Any]:
        return {"flow": new.flow, "queue": new.queue, "inherited_cancel": inherit}

    async def create(self, new: NewRun) -> CreateOutcome:
        """Admit a run (row + ``created`` record + parent edge) in one transaction.

        Re-admitting the same id joins the existing run when its identity matches and
        raises ExecutionIdentityConflict naming the first differing field otherwise.
        A child whose attached parent is already cancelled or settled inherits the
        cancellation here, under the parent's row lock, so no interleaving with the
        parent's cascade can leave it running unsupervised.
        """
        self._validate(new)
        state = self._state(new)
        async with self._db.transaction():
            inherit, inherit_at = False, None
            if new.parent_id is not None:
                parent = await self.get_for_update(new.parent_id)
                if parent is None:
                    raise InvalidInput("parent_id", f"run {new.parent_id!r} does not exist")
                if not set(state["scopes"]) <= set(parent.scopes):
                    raise InvalidInput("scopes", "a child cannot widen its parent's scopes")
                inherit, inherit_at = await self._inherited(new.parent_id, new.on_parent_exit)
            params = self._insert_params([new], [state], inherit)
            rows = await self._insert({**params, "inherit_at_ms": inherit_at})
            row = rows[0] if rows else None
            if row is None:
                if new.parent_id is not None and new.previous_round_id is None:
                    return await self._joined_as_child(new, state)
                return await self._joined(new, state)
            created = run_row(row)
            await self._journal.record(new.id, Kind.CREATED, self._created_record(new, inherit))
            if new.parent_id is not None:
                await self._dag.record_parent(new.id, new.parent_id)
            return Created(created)

    async def create_many(self, news: Sequence[NewRun]) -> list[CreateOutcome]:
        """Admit a batch in one transaction, all or nothing, with ``create``'s rules.

        Parentless runs (the producer's case) go as one multi-row insert and one
        pipelined round of ``created`` records; a batch with children takes ``create`` run by run,
        since each child locks its parent's row.
        """
        if len(news) == 1:
            return [await self.create(news[0])]  # its own transaction, no savepoint
        async with self._db.transaction():
            if any(new.parent_id is not None for new in news):
                return [await self.create(new) for new in news]
            for new in news:
                self._validate(new)
            states = [self._state(new) for new in news]
            params = self._insert_params(news, states, False)
            rows = await self._insert({**params, "inherit_at_ms": None})
            inserted = {row["id"]: row for row in rows}
            outcomes: list[CreateOutcome] = []
            for new, state in zip(news, states, strict=True):
                # Missing: the id was taken, possibly earlier in this very batch (the
                # first of two same-id specs is inserted, the second joins it).
                row = inserted.pop(new.id, None)
                outcomes.append(Created(run_row(row)) if row else await self._joined(new, state))
            await self._journal.record_many(
                [
                    (o.row.id, Kind.CREATED, self._created_record(new, False))
                    for new, o in zip(news, outcomes, strict=True)
                    if isinstance(o, Created)
                ]
            )
            return outcomes

    async def _inherited(self, parent_id: str, policy: OnParentExit) -> tuple[bool, int | None]:
        """Whether a child admitted now under ``parent_id`` starts cancelled, and since when.

        Reads EVERY round of the parent's lineage (the caller holds the parent's row
        lock): a cancel request or a cancelled round anywhere is inherited, with the
        parent's own timestamp; a lineage whose rounds all completed or failed ends the
        child too; a live round spares it (a round that handed off is ``completed``, but
        its lineage carries on). A detached child inherits neither: the cascade never
        reaches it either (DESIGN §8; the seed inherits a cancel even onto a detached one).
        """
        if policy is not OnParentExit.CANCEL:
            return False, None
        rounds = await self._db.all("runs.lineage_rounds", {"id": parent_id})
        for r in rounds:
            if r["cancel_requested_at_ms"] is not None or r["status"] == "cancelled":
                at = r["cancel_requested_at_ms"] or r["updated_at_ms"]
                return True, int(at)
        ended = all(r["status"] in ("completed", "failed") for r in rounds)
        return bool(rounds) and ended, None

    async def _joined_as_child(self, new: NewRun, state: dict[str, Any]) -> Joined:
        """A flow joined a run that exists: a diamond. The joining parent gets its own
        durable edge (cycle-checked), and inherits onto the child as an admission would.

        Every other identity field must still match; only the parent may differ.
        """
        existing = await self.get(new.id)
        if existing is None or existing.state.get("parent") is None:
            # Unknown (says only that the id is taken), or a top-level run: a flow cannot
            # adopt a producer's run as its child (that is the "parent" conflict).
            return await self._joined(new, state)
        assert new.parent_id is not None
        second = existing.state.get("parent") != new.parent_id
        self._check_identity(existing, new, state, parent=not second)
        if not second:
            return Joined(existing)
        await self._dag.record_parent(new.id, new.parent_id)
        inherit, at = await self._inherited(new.parent_id, new.on_parent_exit)
        if inherit:
            row = await self._db.one(
                "runs.inherit_cancel",
                {"id": new.id, "at_ms": at if at is not None else existing.now_ms},
            )
            if row is not None:
                existing = run_row(row)
                asked = {"actor": row["session_role"], "inherited_from": new.parent_id}
                await self._journal.record(new.id, Kind.CANCEL_REQUESTED, asked)
        return Joined(existing)

    def _check_identity(
        self, existing: RunRow, new: NewRun, state: dict[str, Any], *, parent: bool = True
    ) -> None:
        """Join only the same run. Payloads compare by JSON value (``values.same_json``):
        the stored one went through jsonb, which rewrites ``1e16``, ``-0.0`` and
        ``1.5e300``, so an identical re-enqueue must not be told it differs."""
        wanted = [
            ("flow", new.flow),
            ("payload", new.payload),
            ("scopes", sorted(set(new.scopes))),
            ("lineage_id", new.lineage_id or new.id),
            ("round_ordinal", new.round_ordinal),
            ("parent", new.parent_id),
        ]
        for (field, have), (_, want) in zip(_identity(existing), wanted, strict=True):
            if field == "parent" and not parent:
                continue
            if field == "payload":
                if not values.same_json(have, want):
                    raise ExecutionIdentityConflict(
                        existing.id, field, canonical_json(have), canonical_json(want)
                    )
            elif have != want:
                raise ExecutionIdentityConflict(existing.id, field, have, want)

    # ---- claim / activate / steal -----------------------------------------

    async def _changed_or_missing(self, run_id: str) -> SnapshotChanged | NotFound:
        current = await self.get(run_id)
        return SnapshotChanged(current) if current else NotFound(run_id)

    async def claim(self, run_id: str, expected: Snapshot, me: Owner) -> ClaimOutcome:
        async with self._db.transaction():
            row = await self._db.one(
                "runs.claim", {"id": run_id, **owner_params(me), **_expected(expected)}
            )
            if row is None:
                return await self._changed_or_missing(run_id)
            await self._journal.record(run_id, Kind.CLAIMED, {"claimant": me.key})
            return Claimed(run_row(row))

    async def activate(self, run_id: str, me: Owner, claimed_at_ms: int) -> ActivateOutcome:
        async with self._db.transaction():
            row = await self._db.one(
                "runs.activate",
                {"id": run_id, "claimed_at_ms": claimed_at_ms, **owner_params(me)},
            )
            if row is None:
                return await self._changed_or_missing(run_id)
            activated = run_row(row)
            await self._journal.record(
                run_id, Kind.ACTIVATED, {"owner": me.key, "epoch": activated.epoch}
            )
            return Activated(activated)

    async def claim_and_activate(
        self, run_id: str, expected: Snapshot, me: Owner
    ) -> ActivateOutcome:
        """The fast path: claim, activation and its record in one statement."""
        row = await self._db.one(
            "runs.claim_and_activate",
            {
                "id": run_id,
                "owner_key": me.key,
                "journal_kind": Kind.CLAIMED_AND_ACTIVATED,
                "source_id": self._db.source_id,
                "source_seq": self._db.next_source_seq(),
                **owner_params(me),
                **_expected(expected),
            },
        )
        if row is None:
            return await self._changed_or_missing(run_id)
        return Activated(run_row(row))

    async def claim_and_activate_many(
        self, rows: Sequence[RunRow], me: Owner
    ) -> dict[str, ActivateOutcome]:
        """``claim_and_activate`` for a batch of fresh admissions, in one statement.

        Each row must be as read: pending, never started (no owner, lease or claim) and
        not waiting; anything else is refused with InvalidInput (the caller drives those
        one by one). Every row keeps its own snapshot check (status and epoch as read) and
        gets its own record. The outcome of each id is what ``claim_and_activate`` would
        have answered: a row that lost its race is read again (SnapshotChanged/NotFound).
        """
        for row in rows:
            if not fresh_admission(row):
                raise InvalidInput("rows", f"run {row.id!r} is not a fresh admission")
        if not rows:
            return {}
        found = await self._db.all(
            "runs.claim_and_activate_many",
            {
                "ids": [row.id for row in rows],
                "epochs": [row.epoch for row in rows],
                "seqs": [self._db.next_source_seq() for _ in rows],
                "owner_key": me.key,
                "journal_kind": Kind.CLAIMED_AND_ACTIVATED,
                "source_id": self._db.source_id,
                **owner_params(me),
            },
        )
        outcomes: dict[str, ActivateOutcome] = {r["id"]: Activated(run_row(r)) for r in found}
        for row in rows:
            if row.id not in outcomes:
                outcomes[row.id] = await self._changed_or_missing(row.id)
        return outcomes

    async def steal(
        self,
        run_id: str,
        expected: Snapshot,
        me: Owner,
        evidence: dict[str, Any],
        *,
        stale_after_ms: int | None = None,
    ) -> StealOutcome:
        """Take over a running row whose lease is stale by database time.

        ``evidence`` is what the liveness probe saw; it is journaled with the
        previous owner and its last heartbeat as ``stolen-and-activated``.
        """
        previous = expected.owner
        if expected.status is not RunStatus.RUNNING or previous is None:
            raise InvalidInput("expected", "only a running row with an owner can be stolen")
        stale = self._settings.stale_after_ms if stale_after_ms is None else stale_after_ms
        async with self._db.transaction():
            row = await self._db.one(
                "runs.steal",
                {
                    "id": run_id,
                    "stale_after_ms": stale,
                    **owner_params(me),
                    **_expected(expected),
                },
            )
            if row is None:
                current = await self.get(run_id)
                if current is None:
                    return NotFound(run_id)
                if _same(current.snapshot, expected):
                    return LeaseFresh(current)
                return SnapshotChanged(current)
            stolen = run_row(row)
            await self._journal.record(
                run_id,
                Kind.STOLEN_AND_ACTIVATED,
                {
                    "owner": me.key,
                    "epoch": stolen.epoch,
                    "previous_owner": previous.key,
                    "previous_heartbeat_at_ms": expected.heartbeat_at_ms,
                    "lease_age_ms": stolen.now_ms - (expected.heartbeat_at_ms or 0),
                    **evidence,
                },
            )
            return Stolen(stolen, previous)

    async def recover_claim(
        self, run_id: str, claimant: Owner, claimed_at_ms: int, evidence: dict[str, Any]
    ) -> ClaimRecovered | SnapshotChanged | NotFound:
        """Clear a claim stranded by a claimant the caller's probe found dead."""
        async with self._db.transaction():
            row = await self._db.one(
                "runs.recover_claim",
                {
                    "id": run_id,
                    "exp_claim_nonce": claimant.nonce,
                    "exp_claimed_at_ms": claimed_at_ms,
                    "stale_after_ms": self._settings.stale_after_ms,
                },
            )
            if row is None:
                return await self._changed_or_missing(run_id)
            await self._journal.record(
                run_id, Kind.CLAIM_RECOVERED, {"claimant": claimant.key, **evidence}
            )
            return ClaimRecovered(run_row(row))

    async def abandon_claim(self, run_id: str, me: Owner) -> bool:
        async with self._db.transaction():
            row = await self._db.one("runs.abandon_claim", {"id": run_id, **owner_params(me)})
            if row is not None:
                await self._journal.record(run_id, Kind.CLAIM_ABANDONED, {"claimant": me.key})
            return row is not None

    # ---- leases ------------------------------------------------------------

    async def heartbeat(self, me: Owner, run_ids: list[str]) -> Heartbeat:
        """Renew every listed run ``me`` owns in one statement; report the confirmed set."""
        rows = await self._db.all("runs.heartbeat", {"ids": run_ids, **owner_params(me)})
        confirmed = frozenset(r["id"] for r in rows if r["id"] is not None)
        cancels = frozenset(r["id"] for r in rows if r["id"] is not None and r["cancel_requested"])
        return Heartbeat(
            confirmed=confirmed, cancel_requested=cancels, now_ms=int(rows[0]["now_ms"])
        )


def fresh_admission(row: RunRow) -> bool:
    """A row ``claim_and_activate_many`` takes: pending, never started, not waiting."""
    return (
        row.status is RunStatus.PENDING
        and row.waiting is None
        and row.claim is None
        and row.owner is None
        and row.heartbeat_at_ms is None
    )
