"""Run admission: create, join, identity conflicts, and the ``created`` record.

A parentless run (the producer's case, one or a batch) is admitted by one statement
(``store/sql/admit.sql``, a call of ``runfleet.admit``): one round trip and one implicit
transaction, where a ``BEGIN``/insert/record/``COMMIT`` sequence would take four. A child
keeps the transaction that locks its parent's row first, so no interleaving with the
parent's cascade can leave it running unsupervised.

Re-admitting an id joins the existing run when its identity matches, and raises
ExecutionIdentityConflict naming the first differing field otherwise. ``admit_each``
gives each run of a batch its own outcome (a producer's group commit: one caller's
conflict is not another's); ``create_many`` is all or nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.config import Settings
from runfleet.store.dag import Dag
from runfleet.store.db import Database
from runfleet.store.errors import DuplicateRun, ExecutionIdentityConflict, InvalidInput
from runfleet.store.journal import Journal, Kind, digest
from runfleet.store.rows import run_row
from runfleet.store.types.outcomes import Created, CreateOutcome, Joined
from runfleet.store.types.run import (
    NewRun,
    OnDuplicate,
    OnParentExit,
    RunRow,
    RunStatus,
    canonical_json,
)

BATCH_TEXT = 4_000_000
"""The most payload text one admission statement carries; a larger batch goes as several
(a group commit of many callers' megabyte payloads must not become one giant statement)."""


def _chunks(
    batch: list[tuple[NewRun, dict[str, Any], str]],
) -> Iterator[list[tuple[NewRun, dict[str, Any], str]]]:
    chunk: list[tuple[NewRun, dict[str, Any], str]] = []
    size = 0
    for item in batch:
        if chunk and size + len(item[2]) > BATCH_TEXT:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item[2])
    if chunk:
        yield chunk


def _bounded_by_parent(new: NewRun, parent: RunRow) -> int | None:
    """The explicit deadline of a child admitted under ``parent``.

    An attached child never outlives its parent's deadline: its own (``deadline_ms``, or
    its flow's timeout from now, whichever is earlier at insert) is cut to the parent's.
    A detached child keeps its own: it is meant to outlive the parent.
    """
    bound = parent.deadline_ms if new.on_parent_exit is OnParentExit.CANCEL else None
    if bound is None or new.deadline_ms is None:
        return new.deadline_ms if bound is None else bound
    return min(new.deadline_ms, bound)


def _deduplicated(new: NewRun, holder: RunRow | None) -> Joined:
    """An admission whose insert the open-dedup index skipped: the open run, or refused.

    ``holder`` None: the run holding the key is hidden from this role (row-level
    security), or settled between the insert and the read; refused without naming it
    either way, since joining a run the caller cannot see would leak it.
    """
    assert new.dedup_key is not None
    if holder is None or new.on_duplicate is OnDuplicate.REFUSE:
        raise DuplicateRun(new.queue, new.dedup_key, holder.id if holder else None)
    return Joined(holder)


INSTANCE_KEY = "flow_instance"
"""The run-state key of a class-bound flow's instance (``declaration.INSTANCE_STATE_KEY``):
part of the run's identity, since it decides which configured instance's code runs."""


def _identity(row: RunRow) -> list[tuple[str, Any]]:
    return [
        ("flow", row.flow),
        ("payload", row.payload),
        ("scopes", sorted(row.scopes)),
        ("lineage_id", row.lineage_id),
        ("round_ordinal", row.round_ordinal),
        ("parent", row.state.get("parent")),
        ("instance", row.state.get(INSTANCE_KEY)),
    ]


class Admission:
    """Run admission (``store.admission``): ``create``, ``create_many``, ``admit_each``.

    Built alone over a database, the journal, the DAG and the settings; reads of an
    admitted run are ``store.runs``'.
    """

    def __init__(self, db: Database, journal: Journal, dag: Dag, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._dag = dag
        self._settings = settings

    async def _read(self, run_id: str, *, lock: bool = False) -> RunRow | None:
        name = "runs.get_for_update" if lock else "runs.get"
        row = await self._db.one(name, {"id": run_id})
        return run_row(row) if row else None

    # ---- the request, checked --------------------------------------------------

    def _state(self, new: NewRun) -> dict[str, Any]:
        state: dict[str, Any] = new.options.state()
        state.update(
            scopes=sorted(set(new.scopes)),
            parent=new.parent_id,
            on_parent_exit=new.on_parent_exit.value,
            max_rounds=new.max_rounds,
            deadline_ms=new.deadline_ms,  # with timeout_ms, the earlier wins at insert
        )
        validate.run_state(state, self._settings.max_payload_bytes)  # as the database will
        return state

    def _validate(self, new: NewRun) -> None:
        validate.identifier("run_id", new.id)
        validate.identifier("flow", new.flow)
        validate.identifier("queue", new.queue)
        validate.json_value("options", new.options.state(), self._settings.max_payload_bytes)
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
        if new.priority is not None:
            validate.priority(new.priority)
        if new.dedup_key is not None:
            validate.identifier("dedup_key", new.dedup_key)

    def _payload(self, new: NewRun) -> str:
        """The payload as its canonical text (``store.values``), so the flow's arguments
        come back exactly as the producer gave them (``1e16`` stays a float); a payload
        that cannot be stored raises UnstorableValue (field ``payload``)."""
        return values.encode_canonical(new.payload, self._settings.max_payload_bytes, "payload")

    def _insert_params(
        self, news: Sequence[NewRun], states: Sequence[dict[str, Any]], inherit: bool
    ) -> dict[str, Any]:
        """``runs.insert``'s parallel arrays for a batch of admissions."""
        return {
            "id": [n.id for n in news],
            "flow": [n.flow for n in news],
            "queue": [n.queue for n in news],
            "state": [Jsonb(state) for state in states],
            "payload": [self._payload(n) for n in news],
            "lineage_id": [n.lineage_id or n.id for n in news],
            "round_ordinal": [n.round_ordinal for n in news],
            "previous_round_id": [n.previous_round_id for n in news],
            "inherit_cancel": [inherit for _ in news],
            "delay_until_ms": [n.delay_until_ms for n in news],
            "timeout_ms": [n.timeout_ms for n in news],
            "priority": [n.priority for n in news],
            "dedup_key": [n.dedup_key for n in news],
        }

    @staticmethod
    def _created_record(new: NewRun, inherit: bool) -> jr.Created:
        return jr.Created(flow=new.flow, queue=new.queue, inherited_cancel=inherit)

    @staticmethod
    def _refused(exc: psycopg.Error) -> Exception:
        """Data Postgres refuses (a lone surrogate in a payload: jsonb rejects the escape)
        is UnstorableValue, a caller's error, never a retry; anything else as it was."""
        if values.refused_by_database(exc):
            return values.UnstorableValue("payload", f"Postgres refused it: {exc}")
        return validate.database_refusal(exc) or exc

    # ---- admission -------------------------------------------------------------

    async def create(self, new: NewRun) -> CreateOutcome:
        """Admit a run (row + ``created`` record + parent edge) atomically.

        A child whose attached parent is already cancelled or settled inherits the
        cancellation here, under the parent's row lock.
        """
        if new.parent_id is None:
            outcome = (await self._parentless([new], strict=True))[0]
            assert not isinstance(outcome, Exception)  # strict: raised, not returned
            return outcome
        self._validate(new)
        state = self._state(new)
        async with self._db.transaction():
            parent = await self._read(new.parent_id, lock=True)
            if parent is None:
                raise InvalidInput("parent_id", f"run {new.parent_id!r} does not exist")
            if not set(state["scopes"]) <= set(parent.scopes):
                raise InvalidInput("scopes", "a child cannot widen its parent's scopes")
            state["deadline_ms"] = _bounded_by_parent(new, parent)
            inherit, inherit_at = await self._inherited(new.parent_id, new.on_parent_exit)
            params = self._insert_params([new], [state], inherit)
            try:
                rows = await self._db.all("runs.insert", {**params, "inherit_at_ms": inherit_at})
            except psycopg.Error as exc:
                raise self._refused(exc) from exc
            if not rows:
                if new.previous_round_id is None:
                    return await self._joined_as_child(new, state)
                return await self._joined(new, state)
            created = run_row(rows[0])
            await self._journal.record(new.id, self._created_record(new, inherit))
            await self._dag.record_parent(new.id, new.parent_id)
            return Created(created)

    async def create_many(self, news: Sequence[NewRun]) -> list[CreateOutcome]:
        """Admit a batch atomically, all or nothing, with ``create``'s rules.

        Parentless runs (the producer's case) go as one statement (``admit.batch``); a
        batch with children takes ``create`` run by run, since each child locks its
        parent's row.
        """
        if len(news) == 1:
            return [await self.create(news[0])]
        async with self._db.transaction():
            if any(new.parent_id is not None for new in news):
                return [await self.create(new) for new in news]
            outcomes = await self._parentless(news, strict=True)
            return [o for o in outcomes if not isinstance(o, Exception)]

    async def admit_each(self, news: Sequence[NewRun]) -> list[CreateOutcome | Exception]:
        """Admit parentless runs that are independent of each other, in one round trip.

        Each run gets its own outcome: an invalid run or an identity conflict is that
        run's exception, returned in its place, and the others are admitted. An error
        of the statement itself (the connection, a payload Postgres refuses) raises.
        """
        if any(new.parent_id is not None for new in news):
            raise InvalidInput("parent_id", "admit_each is for parentless runs")
        return await self._parentless(news, strict=False)

    async def _parentless(
        self, news: Sequence[NewRun], *, strict: bool
    ) -> list[CreateOutcome | Exception]:
        """Parentless admission; ``strict`` raises the first run's error (in batch order,
        checks before writes), else each error is returned in its run's place."""
        failed: dict[int, Exception] = {}
        for i, new in enumerate(news):
            try:
                self._validate(new)
            except Exception as exc:
                if strict:
                    raise
                failed[i] = exc
        states: dict[int, dict[str, Any]] = {}
        payloads: dict[int, str] = {}
        for i, new in enumerate(news):
            if i not in failed:
                try:
                    states[i], payloads[i] = self._state(new), self._payload(new)
                except Exception as exc:
                    if strict:
                        raise
                    failed[i] = exc
        firsts: dict[str, int] = {}  # a repeated id joins its first occurrence's run
        for i, new in enumerate(news):
            if i not in failed:
                firsts.setdefault(new.id, i)
        inserted: set[str] = set()
        rows: dict[str, RunRow] = {}
        for chunk in _chunks([(news[i], states[i], payloads[i]) for i in firsts.values()]):
            more, found = await self._write(chunk)
            inserted |= more
            rows.update(found)
        holders = {  # the open run holding each (queue, dedup_key), as the write saw it
            (row.queue, row.dedup_key): row
            for row in rows.values()
            if row.dedup_key is not None and not row.status.terminal
        }
        outcomes: list[CreateOutcome | Exception] = []
        for i, new in enumerate(news):
            if i in failed:
                outcomes.append(failed[i])
                continue
            row = rows.get(new.id)
            try:
                if row is not None and new.id in inserted and firsts[new.id] == i:
                    outcomes.append(Created(row))
                elif row is not None:
                    self._check_identity(row, new, states[i])
                    outcomes.append(Joined(row))
                elif new.dedup_key is not None:
                    outcomes.append(_deduplicated(new, holders.get((new.queue, new.dedup_key))))
                else:
                    outcomes.append(await self._joined(new, states[i]))
            except Exception as exc:
                if strict:
                    raise
                outcomes.append(exc)
        return outcomes

    async def _write(
        self, batch: Sequence[tuple[NewRun, dict[str, Any], str]]
    ) -> tuple[set[str], dict[str, RunRow]]:
        """``admit.batch`` (one statement: rows and records), or ``admit.one`` for a batch
        of one: the ids inserted, and every batch run this role can see as it is after
        the insert, by id (with the open holder of a batch run's dedup key)."""
        if not batch:
            return set(), {}
        runs = [
            {
                "id": new.id,
                "flow": new.flow,
                "queue": new.queue,
                "state": state,
                "payload": payload,
                "lineage_id": new.lineage_id or new.id,
                "round_ordinal": new.round_ordinal,
                "previous_round_id": new.previous_round_id,
                "delay_until_ms": new.delay_until_ms,
                "timeout_ms": new.timeout_ms,
                "priority": new.priority,
                "dedup_key": new.dedup_key,
            }
            for new, state, payload in batch
        ]
        records = []
        for new, _state, _payload in batch:
            record = self._created_record(new, False).dump()
            seq = self._db.next_source_seq()
            records.append(
                {
                    "id": new.id,
                    "source_seq": seq,
                    "record": record,
                    "digest": digest(record),
                    "queue": new.queue,
                    "dedup_key": new.dedup_key,
                }
            )
        if len(batch) == 1:  # a single enqueue: scalar parameters (admit.one, 0022)
            one = {**runs[0], **records[0]}
            name = "admit.one"
            params = {
                **one,
                "state": Jsonb(one["state"]),
                "record": Jsonb(one["record"]),
                "kind": Kind.CREATED,
                "source_id": self._db.source_id,
            }
        else:
            name = "admit.batch"
            params = {
                "runs": Jsonb(runs),
                "records": Jsonb(records),
                "kind": Kind.CREATED,
                "source_id": self._db.source_id,
            }
        try:
            found = await self._db.all(name, params)
        except psycopg.Error as exc:
            raise self._refused(exc) from exc
        inserted = {row["id"] for row in found if row["inserted"]}
        return inserted, {row["id"]: run_row(row) for row in found}

    async def _joined(self, new: NewRun, state: dict[str, Any]) -> Joined:
        """The insert found the id taken: join the run if its identity matches ours."""
        existing = await self._read(new.id)
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
            if r["cancel_requested_at_ms"] is not None or r["status"] == RunStatus.CANCELLED:
                at = r["cancel_requested_at_ms"] or r["updated_at_ms"]
                return True, int(at)
        ended = all(r["status"] in (RunStatus.COMPLETED, RunStatus.FAILED) for r in rounds)
        return bool(rounds) and ended, None

    async def _joined_as_child(self, new: NewRun, state: dict[str, Any]) -> Joined:
        """A flow joined a run that exists: a diamond. The joining parent gets its own
        durable edge (cycle-checked), inherits onto the child as an admission would, and
        receives at once the outcome of every round of the child that already settled
        (its settlement handed it only to the parents it had then), so it never waits
        for a wake that was sent before it joined.

        Every other identity field must still match; only the parent may differ.
        """
        existing = await self._read(new.id)
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
        await self._dag.deliver_settled(new.id, new.parent_id)
        inherit, at = await self._inherited(new.parent_id, new.on_parent_exit)
        if inherit:
            row = await self._db.one(
                "runs.inherit_cancel",
                {"id": new.id, "at_ms": at if at is not None else existing.now_ms},
            )
            if row is not None:
                existing = run_row(row)
                asked = jr.CancelRequested(actor=row["session_role"], inherited_from=new.parent_id)
                await self._journal.record(new.id, asked)
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
            ("instance", state.get(INSTANCE_KEY)),
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
