"""Run reads and the claim / activate / steal compare-and-swap family (admission: store.admit).

Each CAS states its full precondition in SQL and writes its journal record in the
same transaction; zero rows updated is reported as the outcome that explains why.

A statement that names one run waits for that run's row lock, but not for ever on a
worker's store: its connections carry ``lock_timeout`` (``Settings.worker_lock_wait_ms``,
a quarter interval), and a wait past it — a tenant's login holding its own run's row
``FOR UPDATE`` — answers ``RowLocked`` with the row as read without a lock, nothing
written: the caller sets that run aside and takes it up later. The bound is a wait, not
``SKIP LOCKED``: a claim that meets another claimant's lock must wait for it to commit
and then re-check the row (the race's loser reads the winner's change, not a row that
looks untouched), which the lock-gate races prove (tests/store/test_claims.py,
tests/store_model); a worker holds a run's row for one statement or one short
transaction, far below the bound. Batch statements, which would otherwise hold every
run they name behind one row, skip locked rows instead (``claim_and_activate_many``,
the renewal, ``settle_many``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
from runfleet.store.config import Settings
from runfleet.store.db import Database, LockWaitEnded
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Journal, Kind
from runfleet.store.rows import owner_params, run_row
from runfleet.store.types.outcomes import (
    Activated,
    ActivateOutcome,
    AtLimit,
    Claimed,
    ClaimOutcome,
    ClaimRecovered,
    DeadLettered,
    Heartbeat,
    LeaseFresh,
    NotFound,
    NotServed,
    Reconfirmation,
    RowLocked,
    SnapshotChanged,
    StealOutcome,
    Stolen,
)
from runfleet.store.types.run import Owner, RunRow, RunStatus, Snapshot


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


@dataclass(frozen=True, slots=True)
class FreshClaim:
    """``Runs.claim_if_fresh``'s answer: the claim's outcome (None: the row was not a
    fresh admission, decide from ``seen``) and the row as the statement read it."""

    outcome: ActivateOutcome | None
    seen: RunRow | None


class Runs:
    """Reads, the claim / activate / steal CAS family and leases; admission
    (``create``, ``create_many``, ``admit_each``) is ``store.admission``
    (``store.admit.Admission``).

    ``serves`` is the queues this store's claimant serves (a worker's ``--queues``):
    every claim, activation and steal refuses a run of another queue in its own SQL
    (``NotServed``), whichever path brought the run. None serves every queue (tools,
    tests, benchmarks).
    """

    def __init__(
        self,
        db: Database,
        journal: Journal,
        settings: Settings,
        serves: Collection[str] | None = None,
    ) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings
        self.serves: frozenset[str] | None = None if serves is None else frozenset(serves)

    def may_claim(self, row: RunRow) -> bool:
        """Whether this claimant may claim ``row``: its queue is served, or it is a pending
        run with a cancel request (closing one executes nothing). The SQL of every claim
        states the same rule; this is the read-side copy the driver decides with."""
        return (
            self.serves is None
            or row.queue in self.serves
            or (row.status is RunStatus.PENDING and row.cancel_requested_at_ms is not None)
        )

    def _serving(self) -> dict[str, Any]:
        return {"serves": None if self.serves is None else sorted(self.serves)}

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

    # ---- claim / activate / steal -----------------------------------------

    async def _changed_or_missing(self, run_id: str) -> SnapshotChanged | NotServed | NotFound:
        current = await self.get(run_id)
        return self._lost(run_id, current)

    async def _locked(self, run_id: str) -> RowLocked | NotFound:
        """A statement on this run alone gave up on its row lock (``LockWaitEnded``): the
        row as it is now, read without a lock (a read never waits on a row lock)."""
        current = await self.get(run_id)
        return NotFound(run_id) if current is None else RowLocked(current)

    def _lost(self, run_id: str, current: RunRow | None) -> SnapshotChanged | NotServed | NotFound:
        """Why a claim statement changed nothing, from the row as it is now."""
        if current is None:
            return NotFound(run_id)
        if not self.may_claim(current):
            return NotServed(current)
        return SnapshotChanged(current)

    def _not_activated(
        self, run_id: str, current: RunRow | None, expected: Snapshot
    ) -> SnapshotChanged | NotServed | AtLimit | RowLocked | NotFound:
        """``_lost`` for an activating claim: with nothing the caller's snapshot names moved
        and the row still runnable, only its queue's concurrency limit refused it."""
        if (
            current is not None
            and self.may_claim(current)
            and _same(current.snapshot, expected)
            and current.status in (RunStatus.PENDING, RunStatus.SUSPENDED)
            and current.claim is None
            and current.waiting is None
            and current.cancel_requested_at_ms is None
        ):
            return AtLimit(current)
        return self._lost(run_id, current)

    async def _waited(
        self, outcome: SnapshotChanged | NotServed | AtLimit | RowLocked | NotFound
    ) -> SnapshotChanged | NotServed | AtLimit | RowLocked | NotFound:
        """An AtLimit with when its queue's rate next allows a start (one read, refusals
        only; the claim itself stays one statement). On a queue with no limit at all the
        unchanged row was not refused by one: a batch claim skipped it, locked elsewhere
        (``RowLocked``)."""
        if not isinstance(outcome, AtLimit):
            return outcome
        row = outcome.current
        wait = await self._db.one("queues.wait", {"name": row.queue})
        if wait is None or not wait["limited"]:
            return RowLocked(row)
        waits = [] if wait is None or wait["wait_ms"] is None else [int(wait["wait_ms"])]
        # its key's rate (docs/how-to/queues.md), a keyed run only
        if row.concurrency_key is not None:
            key = await self._db.one(
                "queues.keys", {"name": row.queue, "key": row.concurrency_key, "limit": 1}
            )
            if key is not None and key["wait_ms"] is not None:
                waits.append(int(key["wait_ms"]))
        return AtLimit(row, max(waits)) if waits else outcome

    async def claim(self, run_id: str, expected: Snapshot, me: Owner) -> ClaimOutcome:
        async with self._db.transaction():
            row = await self._db.one(
                "runs.claim",
                {"id": run_id, **owner_params(me), **_expected(expected), **self._serving()},
            )
            if row is None:
                return await self._changed_or_missing(run_id)
            await self._journal.record(run_id, jr.Claimed(claimant=me.key))
            return Claimed(run_row(row))

    async def activate(self, run_id: str, me: Owner, claimed_at_ms: int) -> ActivateOutcome:
        async with self._db.transaction():
            row = await self._db.one(
                "runs.activate",
                {
                    "id": run_id,
                    "claimed_at_ms": claimed_at_ms,
                    **owner_params(me),
                    **self._serving(),
                },
            )
            if row is None:
                return await self._changed_or_missing(run_id)
            activated = run_row(row)
            await self._journal.record(run_id, jr.Activated(owner=me.key, epoch=activated.epoch))
            return Activated(activated)

    async def claim_and_activate(
        self, run_id: str, expected: Snapshot, me: Owner
    ) -> ActivateOutcome:
        """The fast path: claim, activation and its record in one statement. A row another
        transaction holds past the store's lock bound is ``RowLocked`` (set aside)."""
        try:
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
                    **self._serving(),
                },
            )
        except LockWaitEnded:
            return await self._locked(run_id)
        if row is None:
            return await self._waited(self._not_activated(run_id, await self.get(run_id), expected))
        return Activated(run_row(row))

    async def claim_if_fresh(
        self, run_id: str, flow: str, me: Owner, ahead_flows: Collection[str] | None = None
    ) -> FreshClaim:
        """Read ``run_id`` and, if it is a fresh admission of ``flow`` with no cancel
        asked, claim and activate it, in one statement (``runs.claim_if_fresh``).

        ``outcome`` is what ``claim_and_activate`` would have answered for a fresh row
        (Activated, or SnapshotChanged/NotFound when a concurrent claim won after this
        statement's snapshot), and None when the row was not such a row: the caller then
        decides from ``seen``, the row as read (None: no such run).

        ``ahead_flows``: the flows the caller runs. Given, a fresh run of the same queue
        with a higher priority takes the slot (docs/how-to/queues.md): ``outcome`` is then
        Activated with that run, and the named run stays pending (its wake is the
        caller's to re-publish). None: only the named run is claimed.

        A row another transaction holds past the store's lock bound (its producer's
        lock, or a claim in flight elsewhere) is ``RowLocked`` with the row as it is now
        (read without a lock), nothing claimed: that run is set aside, not waited for.
        """
        try:
            found = await self._db.all(
                "runs.claim_if_fresh",
                {
                    "id": run_id,
                    "flow": flow,
                    "ahead_flows": None if ahead_flows is None else sorted(ahead_flows),
                    "owner_key": me.key,
                    "journal_kind": Kind.CLAIMED_AND_ACTIVATED,
                    "source_id": self._db.source_id,
                    "source_seq": self._db.next_source_seq(),
                    **owner_params(me),
                    **self._serving(),
                },
            )
        except LockWaitEnded:
            current = await self.get(run_id)
            return FreshClaim(None if current is None else RowLocked(current), current)
        seen = next((run_row(r) for r in found if not r["activated"]), None)
        activated = next((run_row(r) for r in found if r["activated"]), None)
        if activated is not None:
            return FreshClaim(Activated(activated), seen)
        if (
            seen is None
            or not self.may_claim(seen)
            or not (
                fresh_admission(seen) and seen.cancel_requested_at_ms is None and seen.flow == flow
            )
        ):
            return FreshClaim(None, seen)
        current = await self.get(run_id)  # the race it lost: who won, for the record
        return FreshClaim(
            await self._waited(self._not_activated(run_id, current, seen.snapshot)), seen
        )

    async def claim_and_activate_many(
        self, rows: Sequence[RunRow], me: Owner, ahead_flows: Collection[str] | None = None
    ) -> dict[str, ActivateOutcome]:
        """``claim_and_activate`` for a batch of fresh admissions, in one statement.

        Each row must be as read: pending, never started (no owner, lease or claim) and
        not waiting; anything else is refused with InvalidInput (the caller drives those
        one by one). Every row keeps its own snapshot check (status and epoch as read) and
        gets its own record. The outcome of each id is what ``claim_and_activate`` would
        have answered: a row that lost its race is read again (SnapshotChanged/NotFound).
        ``ahead_flows`` as for ``claim_if_fresh``: a delivered run's outcome may be the
        activation of a higher-priority run of its queue, claimed in its place.
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
                "ahead_flows": None if ahead_flows is None else sorted(ahead_flows),
                "owner_key": me.key,
                "journal_kind": Kind.CLAIMED_AND_ACTIVATED,
                "source_id": self._db.source_id,
                **owner_params(me),
                **self._serving(),
            },
        )
        outcomes: dict[str, ActivateOutcome] = {r["named_id"]: Activated(run_row(r)) for r in found}
        lost = [row.id for row in rows if row.id not in outcomes]
        if lost:  # what each loser lost to, in one read
            current = {row.id: row for row in await self.get_many(lost)}
            asked = {row.id: row.snapshot for row in rows}
            for run_id in lost:
                outcomes[run_id] = await self._waited(
                    self._not_activated(run_id, current.get(run_id), asked[run_id])
                )
        return outcomes

    async def steal(
        self,
        run_id: str,
        expected: Snapshot,
        me: Owner,
        evidence: jr.ProbeEvidence,
        *,
        stale_after_ms: int | None = None,
        counted: bool = True,
        max_recoveries: int | None = None,
        dead_letter: bool = True,
    ) -> StealOutcome:
        """Take over a running row whose lease is stale by database time.

        ``evidence`` is what the liveness probe saw; it is journaled with the
        previous owner and its last heartbeat as ``stolen-and-activated``.

        A ``counted`` takeover (the previous owner's process was lost, not this process
        taking back a run it orphaned) is one more recovery in a row; a run already at
        ``Settings.max_recoveries`` is parked ``dead`` instead (``DeadLettered``, journaled
        ``dead-lettered`` with the owners it lost), in the same transaction and under the
        same precondition, so the count is decided in Postgres whoever else steals.
        ``max_recoveries``: the run's flow's own limit (``@flow(max_recoveries=)``; None:
        the fleet's); ``dead_letter=False``: the flow never dead-letters, every counted
        takeover proceeds (the count still rises, for ``explain``). A row another
        transaction holds past the store's lock bound is ``RowLocked``: nothing written,
        the run set aside for a later sweep.
        """
        previous = expected.owner
        if expected.status is not RunStatus.RUNNING or previous is None:
            raise InvalidInput("expected", "only a running row with an owner can be stolen")
        stale = self._settings.stale_after_ms if stale_after_ms is None else stale_after_ms
        cas = {
            "id": run_id,
            "stale_after_ms": stale,
            "counted": counted,
            "max_recoveries": (
                None
                if not dead_letter
                else self._settings.max_recoveries
                if max_recoveries is None
                else validate.count("max_recoveries", max_recoveries)
            ),
            **_expected(expected),
            **self._serving(),
        }
        try:
            return await self._steal(run_id, expected, me, evidence, cas, counted and dead_letter)
        except LockWaitEnded:
            return await self._locked(run_id)

    async def _steal(
        self,
        run_id: str,
        expected: Snapshot,
        me: Owner,
        evidence: jr.ProbeEvidence,
        cas: dict[str, Any],
        bury: bool,
    ) -> StealOutcome:
        """``steal``'s transaction: the CAS, else the burial of a poison run (``bury``)."""
        previous = expected.owner
        assert previous is not None
        async with self._db.transaction():
            row = await self._db.one("runs.steal", {**cas, **owner_params(me)})
            if row is None and bury:
                buried = await self._bury(run_id, previous, me, cas, evidence)
                if buried is not None:
                    return buried
            if row is None:
                current = await self.get(run_id)
                if current is None:
                    return NotFound(run_id)
                if not self.may_claim(current):
                    return NotServed(current)
                if _same(current.snapshot, expected):
                    return LeaseFresh(current)
                return SnapshotChanged(current)
            stolen = run_row(row)
            taken = jr.StolenAndActivated(
                owner=me.key,
                epoch=stolen.epoch,
                previous_owner=previous.key,
                previous_heartbeat_at_ms=expected.heartbeat_at_ms,
                lease_age_ms=stolen.now_ms - (expected.heartbeat_at_ms or 0),
                probe=evidence.probe,
                observer=evidence.observer,
                probe_detail=evidence.probe_detail,
            )
            await self._journal.record(run_id, taken)
            return Stolen(stolen, previous)

    async def _bury(
        self,
        run_id: str,
        previous: Owner,
        me: Owner,
        cas: dict[str, Any],
        evidence: jr.ProbeEvidence,
    ) -> DeadLettered | None:
        """Park a poison run ``dead`` if the steal's precondition holds and it is at the
        limit (``runs.bury``); None when it is not (the steal's own outcome applies)."""
        limit = int(cas["max_recoveries"])
        lost = await self._db.all("runs.lost_owners", {"id": run_id, "limit": max(1, limit)})
        owners = [previous.key, *(str(r["owner"]) for r in lost if r["owner"])]
        request: dict[str, Any] = {
            "max_recoveries": limit,
            "lost_owners": owners[: limit + 1],
            "last_owner": previous.key,
            "probe": evidence.probe,
        }
        row = await self._db.one("runs.bury", {**cas, "evidence": Jsonb(request)})
        if row is None:
            return None
        dead = run_row(row)
        request = {**request, "recoveries": dead.recoveries}  # as the statement found it
        buried = jr.DeadLettered(
            probe=evidence.probe,
            probe_detail=evidence.probe_detail,
            max_recoveries=limit,
            lost_owners=owners[: limit + 1],
            last_owner=previous.key,
            recoveries=dead.recoveries,
            observer=me.key,
            previous_owner=previous.key,
            previous_heartbeat_at_ms=cas["exp_heartbeat_at_ms"],
            epoch=dead.epoch,
        )
        await self._journal.record(run_id, buried)
        return DeadLettered(dead, previous, request)

    async def revive(self, run_id: str, *, note: str | None = None) -> RunRow | None:
        """An operator moves a run parked ``dead`` on: its wait cleared, its recoveries in
        a row back to 0, journaled ``resumed`` (``from: dead``) with the authenticated role
        as actor and ``note`` as the caller's words. None when the run is not parked dead
        (nothing changed)."""
        if note is not None:
            validate.identifier("actor", note)
        async with self._db.transaction():
            row = await self._db.one("runs.revive", {"id": run_id})
            if row is None:
                return None
            await self._journal.record(
                run_id,
                jr.Resumed(
                    from_state=jr.ResumedFrom.DEAD,
                    recoveries=int(row["recoveries_before"]),
                    evidence=row["dead_evidence"],
                    actor=row["session_role"],
                    note=note,
                ),
            )
            return run_row(row)

    async def recover_claim(
        self, run_id: str, claimant: Owner, claimed_at_ms: int, evidence: jr.ProbeEvidence
    ) -> ClaimRecovered | SnapshotChanged | NotFound:
        """Clear a claim stranded by a claimant the caller's probe found dead.

        Not limited to the queues served: clearing claims nothing, it makes the run
        claimable again by its own queue's workers."""
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
                current = await self.get(run_id)
                return SnapshotChanged(current) if current else NotFound(run_id)
            recovered = jr.ClaimRecovered(
                claimant=claimant.key, probe=evidence.probe, probe_detail=evidence.probe_detail
            )
            await self._journal.record(run_id, recovered)
            return ClaimRecovered(run_row(row))

    async def abandon_claim(self, run_id: str, me: Owner) -> bool:
        async with self._db.transaction():
            row = await self._db.one("runs.abandon_claim", {"id": run_id, **owner_params(me)})
            if row is not None:
                abandoned = jr.ClaimAbandoned(claimant=me.key)
                await self._journal.record(run_id, abandoned)
            return row is not None

    # ---- leases ------------------------------------------------------------

    async def heartbeat(
        self, me: Owner, run_ids: list[str], *, reconfirm: Reconfirmation | None = None
    ) -> Heartbeat:
        """Renew every listed run ``me`` owns in one statement; report the confirmed set.

        Never waits on a row lock: a run whose row another transaction holds locked is
        answered in ``skipped`` (still ours, not renewed this beat).

        With ``reconfirm`` (the first renewal after a lapse), the same statement journals
        ``lease-reconfirmed`` on each run it renewed at the epoch ``reconfirm`` names."""
        epochs = dict(reconfirm.epochs) if reconfirm is not None else {}
        rows = await self._db.all(
            "runs.heartbeat",
            {
                "ids": run_ids,
                "re_ids": list(epochs),
                "re_epochs": list(epochs.values()),
                "re_seqs": [self._db.next_source_seq() for _ in epochs],
                "source_id": self._db.source_id,
                "journal_kind": Kind.LEASE_RECONFIRMED,
                "owner_key": me.key,
                "unconfirmed_ms": reconfirm.unconfirmed_ms if reconfirm is not None else None,
                **owner_params(me),
            },
        )
        renewed = [r for r in rows if r["id"] is not None]
        return Heartbeat(
            confirmed=frozenset(r["id"] for r in renewed),
            cancel_requested=frozenset(r["id"] for r in renewed if r["cancel_requested"]),
            now_ms=int(rows[0]["now_ms"]),
            reconfirmed=frozenset(r["id"] for r in renewed if r["reconfirmed"]),
            skipped=frozenset(rows[0]["skipped"]),
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
