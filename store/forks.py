"""Resume a settled run from its recorded calls, fork a run from call N, delete a run.

Terminal is never left (DESIGN §3), so neither resume nor fork reopens a row: each admits
a **new** run whose history starts as a copy of the source's recorded calls. Replay then
returns those records without running them and executes from the first position not
copied — the same rule that makes every resume after a crash safe.

- **resume** (a failed or cancelled run; DBOS ``resume_workflow``): the next round of the
  run's lineage (``lineage@n``, so a retried call joins it), with every recorded call up
  to the first one a cancel compensated. The settled round stays as it was and says
  ``resumed_as``.
- **fork** (any run; DBOS ``fork_workflow``, Temporal's reset): a new run (its own
  lineage) with the source's calls before position N. Their compensations are not copied:
  the fork did not cause those effects, so cancelling it must not undo them.

What the copied waits read is copied with them (an event's answer, an approval's decision,
a settled child's completion, a fired timer), and the events the source had set before
the point are set on the new run. Both runs journal it (``forked`` or ``resumed-as`` on
the source, ``history-copied`` on the new run), and the new run's state says ``replays``
(how many calls it copied): its first activation loads them, which a first activation
otherwise skips (``worker.driver``: nothing could have recorded before it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Kind
from runfleet.store.rounds import next_ordinal, next_round
from runfleet.store.steps import StepRecord
from runfleet.store.types.options import AdmissionOptions, Forked, Resumed, RqOptions
from runfleet.store.types.outcomes import Created, Joined
from runfleet.store.types.run import NewRun, RunRow, RunStatus

if TYPE_CHECKING:
    from runfleet.store import Store


def carried(source: RunRow, origin: Forked | Resumed) -> AdmissionOptions:
    """The options a resumed round or a fork keeps from ``source``: rq's meta, description
    and TTLs, the version its history was recorded by, and a class-bound flow's instance
    (so the same workers take it)."""
    was = AdmissionOptions.from_state(source.state)
    kept = RqOptions(
        meta=was.rq.meta,
        description=was.rq.description,
        result_ttl=was.rq.result_ttl,
        failure_ttl=was.rq.failure_ttl,
    )
    return AdmissionOptions(
        rq=kept, flow_version=was.flow_version, flow_instance=was.flow_instance, origin=origin
    )


@dataclass(frozen=True, slots=True)
class Deleted:
    """What ``delete`` removed: the lineage's rounds and how many rows were theirs."""

    run_ids: tuple[str, ...]
    journal: int
    steps: int


def _wait_names(records: list[StepRecord]) -> list[str]:
    """The deferreds the waits among ``records`` read when they are replayed."""
    names: list[str] = []
    for r in records:
        output = r.output if isinstance(r.output, dict) else {}
        match r.kind:
            case "event":
                names.append(r.name)
            case "approval":
                names.append(f"approval:{r.name}")
            case "child" | "spawn" if isinstance(output.get("run_id"), str):
                names.append(f"child:{output['run_id']}")
            case "sleep":
                names.append(r.key)
    return names


class Forks:
    """Resume, fork and delete: decisions over several of the store's concepts."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db

    async def fork(
        self, run_id: str, *, upto: int, new_id: str | None = None, actor: str | None = None
    ) -> RunRow:
        """A new run replaying the first ``upto`` recorded calls of ``run_id``.

        ``upto`` counts recorded calls (positions 0..upto-1); the source must have
        recorded that many. A child among them must have settled (its result is what
        the fork's replay reads). ``new_id`` is the fork's id (generated if None).
        """
        if isinstance(upto, bool) or not isinstance(upto, int) or upto < 0:
            raise InvalidInput("from_step", f"must be an integer >= 0, got {upto!r}")
        if new_id is not None:
            validate.identifier("run_id", new_id)
        if actor is not None:
            validate.identifier("actor", actor)
        async with self._db.transaction():
            source = await self._store.runs.get_for_update(run_id)
            if source is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            records = [r for r in await self._store.steps.of_run(run_id) if r.position < upto]
            if len(records) < upto or [r.position for r in records] != list(range(upto)):
                raise InvalidInput(
                    "from_step", f"run {run_id!r} recorded {len(records)} calls, not {upto}"
                )
            fork_id = new_id or f"{run_id[:200]}~fork-{secrets.token_hex(6)}"
            outcome = await self._store.admission.create(
                NewRun(
                    id=fork_id,
                    flow=source.flow,
                    queue=source.queue,
                    payload=source.payload,
                    scopes=source.scopes,
                    max_rounds=source.max_rounds,
                    options=carried(source, Forked(run_id, upto)),
                )
            )
            match outcome:
                case Joined(row=row):
                    return row  # a retried fork with its id: the first one's run
                case Created(row=row):
                    pass
            await self._copy(source, row, records, upto, keep_compensations=False)
            await self._journal_both(source.id, row.id, upto, actor, Kind.FORKED)
            return row

    async def resume(self, run_id: str, *, actor: str | None = None) -> RunRow:
        """Resume a failed or cancelled run: its lineage's next round replays its records.

        The records copied end before the first call a cancel compensated (what follows
        ran after an effect was undone). A run already resumed answers with the round
        that replaced it while that is open, and is read through it once it settled.
        """
        if actor is not None:
            validate.identifier("actor", actor)
        async with self._db.transaction():
            row = await self._store.runs.get_for_update(run_id)
            while row is not None and row.state.get("resumed_as"):
                following = await self._store.runs.get_for_update(str(row.state["resumed_as"]))
                if following is None:
                    break
                if not following.status.terminal:
                    return following  # resumed already and still open: join it
                row = following
            if row is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            if row.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
                raise InvalidInput(
                    "run_id",
                    f"run {row.id!r} is {row.status.value}: only a failed or"
                    " cancelled run is resumed",
                )
            records: list[StepRecord] = []
            for record in await self._store.steps.of_run(row.id):
                if record.compensated_at_ms is not None or record.position != len(records):
                    break
                records.append(record)
            latest = await self._store.runs.latest_round(row.lineage_id)
            resumed = carried(row, Resumed(row.id, len(records)))
            outcome = await self._store.admission.create(
                next_round(row, next_ordinal(row, latest), options=resumed)
            )
            match outcome:
                case Joined(row=new):
                    return new
                case Created(row=new):
                    pass
            await self._copy(row, new, records, len(records), keep_compensations=True)
            await self._db.one("forks.mark_resumed", {"id": row.id, "to": new.id})
            await self._journal_both(row.id, new.id, len(records), actor, Kind.RESUMED_AS)
            return new

    async def delete(self, run_id: str) -> Deleted:
        """Delete a settled run's lineage (every round) and everything that is theirs.

        Refused (InvalidInput) while any round is unsettled. Children are not deleted:
        their edges to these runs go, they stay (retention prunes them in their turn).
        """
        async with self._db.transaction():
            row = await self._store.runs.get_for_update(run_id)
            if row is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            rounds = await self._db.all("forks.lineage_rows", {"lineage": row.lineage_id})
            open_ = [r["id"] for r in rounds if not RunStatus(r["status"]).terminal]
            if open_:
                raise InvalidInput(
                    "run_id", f"run {run_id!r} is not settled (round {open_[0]!r} is open)"
                )
            ids = tuple(r["id"] for r in rounds)
            done = await self._db.one("forks.delete_runs", {"ids": list(ids)})
            assert done is not None
            return Deleted(ids, int(done["journal"]), int(done["steps"]))

    # ---- shared ------------------------------------------------------------

    async def _copy(
        self,
        source: RunRow,
        target: RunRow,
        records: list[StepRecord],
        upto: int,
        *,
        keep_compensations: bool,
    ) -> None:
        await self._db.all(
            "forks.copy_steps",
            {
                "from": source.id,
                "to": target.id,
                "upto": upto,
                "keep_compensations": keep_compensations,
            },
        )
        names = _wait_names(records)
        if names:
            await self._db.all(
                "forks.copy_deferreds", {"from": source.id, "to": target.id, "names": names}
            )
        versions: dict[str, int] = {}
        latest: dict[str, Any] = {}
        for record in records:
            output = record.output if isinstance(record.output, dict) else {}
            if record.kind == "set_event" and "value" in output:
                versions[record.name] = versions.get(record.name, 0) + 1
                latest[record.name] = output["value"]
        limit = self._store.settings.max_payload_bytes
        for key, value in latest.items():
            text = values.encode_canonical(value, limit, "event value")
            await self._db.execute(
                "forks.event_put",
                {"run_id": target.id, "key": key, "value": text, "version": versions[key]},
            )

    async def _journal_both(
        self, source: str, target: str, upto: int, note: str | None, kind: str
    ) -> None:
        """Both runs' records, naming the authenticated role that asked (``session_user``,
        never a caller-chosen name) as ``actor`` and the caller's words as ``note``."""
        found = await self._db.one("forks.session_role", {})
        role = str(found["role"]) if found else None
        side = jr.Forked if kind == Kind.FORKED else jr.ResumedAs
        await self._store.journal.record(source, side(to=target, calls=upto, actor=role, note=note))
        copied = jr.ForkedFrom(from_run=source, calls=upto, kind=kind, actor=role, note=note)
        await self._store.journal.record(target, copied)
