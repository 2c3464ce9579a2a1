"""rq's producer reads and writes over run rows: queued ids, the failed registry, meta,
and requeueing a failed run.

Kept apart from ``store.runs`` because these answer rq's questions ("what is in
the queue", "which jobs failed") in rq's terms; its callers are rq's face (``rqface``)
and the rq options the producer and the worker honour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from runfleet.store import validate
from runfleet.store.errors import InvalidInput
from runfleet.store.rounds import next_ordinal, next_round
from runfleet.store.types import AdmissionOptions, Requeued, RqOptions, RunRow, RunStatus

if TYPE_CHECKING:
    from runfleet.store import Store


def requeued(row: RunRow, actor: str | None) -> AdmissionOptions:
    """The options a requeued round keeps from the failed one ``row``: rq's meta,
    description, retry, callbacks, TTLs and dependencies."""
    was = RqOptions.from_state(row.state)
    kept = RqOptions(
        meta=was.meta,
        description=was.description,
        retry=was.retry,
        callbacks=was.callbacks,
        result_ttl=was.result_ttl,
        failure_ttl=was.failure_ttl,
        depends_on=was.depends_on,
    )
    return AdmissionOptions(rq=kept, origin=Requeued(row.id, actor))


class Activation(NamedTuple):
    """``Jobs.activation``'s answer (rq's ``started_at`` and ``worker_name``)."""

    started_ms: int | None
    worker: str | None
    """The owner key (``host:pid:nonce``) of the last activation's worker process."""


class Jobs:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = store.db

    async def failed_ids(self, queue: str, scopes: Sequence[str], limit: int) -> list[str]:
        params = {"queue": queue, "scopes": Jsonb(sorted(scopes)), "limit": limit}
        return [r["id"] for r in await self._db.all("jobs.failed_ids", params)]

    async def save_meta(self, run_id: str, meta: dict[str, Any]) -> bool:
        """Replace the run's ``meta``; False when no such run (or not visible)."""
        cap = self._store.settings.max_payload_bytes
        validate.json_value("meta", meta, cap)
        validate.stored_jsonb("meta", meta, cap)  # as the database measures it (0013)
        params = {"id": run_id, "meta": Jsonb(meta)}
        try:
            return await self._db.one("jobs.save_meta", params) is not None
        except psycopg.errors.CheckViolation as exc:
            raise (validate.database_refusal(exc) or exc) from exc

    async def activation(self, run_id: str) -> Activation:
        """When the run first started and which worker process started it last."""
        row = await self._db.one("jobs.started_at", {"id": run_id})
        if row is None or row["at_ms"] is None:
            return Activation(None, None)
        return Activation(int(row["at_ms"]), row["worker"])

    async def requeue(self, run_id: str, *, actor: str | None) -> RunRow:
        """Admit the next round of a failed run's lineage with its flow and arguments.

        Under the failed row's lock: a run already requeued answers with the round
        that replaced it while that round is open (a retried call joins it), and is
        read through that round once it settled (failed again: requeued again;
        completed or cancelled: refused, as rq refuses a job not in its registry).
        The new round's id is ``lineage@n``, as a handoff's successor, so a retried
        call after a lost answer joins it.
        """
        async with self._store.transaction():
            row = await self._store.runs.get_for_update(run_id)
            while row is not None and row.requeued_as:
                following = await self._store.runs.get_for_update(row.requeued_as)
                if following is None:
                    break
                if not following.status.terminal:
                    return following  # requeued already and still open: join it
                row = following
            if row is None:
                raise InvalidInput("run_id", f"no run with id {run_id!r}")
            if row.status is not RunStatus.FAILED:
                raise InvalidInput("run_id", f"run {run_id!r} is {row.status.value}, not failed")
            latest = await self._store.runs.latest_round(row.lineage_id)
            created = await self._store.admission.create(
                next_round(row, next_ordinal(row, latest), options=requeued(row, actor))
            )
            await self._db.one("jobs.mark_requeued", {"id": row.id, "to": created.row.id})
            return created.row
