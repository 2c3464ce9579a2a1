"""Producer calls that act on a run's history: resume it, fork it, delete it.

``RunHistory`` is built with the producer's session (``producer.session``), and
``producer.queue.AsyncQueue`` delegates to it. Postgres decides (``store.forks``); the new
run's stream message is only a hint. Each writes rows a producer role may not write
(recorded steps, every table of a run): run them as a role that may (the worker's or the
migrator's), as ``runfleet`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runfleet.broker.streams import Lane
from runfleet.producer.run import AsyncRun
from runfleet.producer.session import ProducerSession
from runfleet.store.errors import RunNotFound
from runfleet.store.forks import Deleted, Forks
from runfleet.store.types import RunRow

log = logging.getLogger("runfleet.producer.queue")


class RunHistory:
    """A producer's calls on a run's history, built with its session and the producer's
    handle factory (``AsyncQueue.run``: the new run's ``AsyncRun``)."""

    def __init__(self, session: ProducerSession, handle: Callable[[str], AsyncRun]) -> None:
        self._session = session
        self._handle = handle

    async def resume_run(self, run_id: str, *, actor: str | None = None) -> AsyncRun:
        """Resume a failed or cancelled run from its recorded calls (DBOS resume_workflow).

        A new round of its lineage replays them and runs on from the first one not
        recorded; the settled round stays settled (``resumed_as``: terminal is never left,
        DESIGN §3), and the handle returned is the id the caller holds, which answers
        through that round (``ProducerSession.answering``). Resuming again while that
        round is open joins it.
        """
        await self._session.authorized(run_id)
        forks = Forks(self._session.store)
        new: RunRow = await self._session.available(lambda: forks.resume(run_id, actor=actor))
        await self._session.publish_ready([new], lane=Lane.NORMAL)
        return self._handle(run_id)

    async def fork(
        self,
        run_id: str,
        from_step: int,
        *,
        new_run_id: str | None = None,
        actor: str | None = None,
    ) -> AsyncRun:
        """A new run that replays the first ``from_step`` recorded calls of ``run_id`` and
        executes from there (DBOS fork_workflow, Temporal reset); any status."""
        await self._session.authorized(run_id)
        forks = Forks(self._session.store)
        new: RunRow = await self._session.available(
            lambda: forks.fork(run_id, upto=from_step, new_id=new_run_id, actor=actor)
        )
        await self._session.publish_ready([new], lane=Lane.NORMAL)
        return self._handle(new.id)

    async def delete_run(self, run_id: str, *, actor: str | None = None) -> Deleted:
        """Delete a settled run — every round of its lineage — and all that is theirs.
        An id that names no run (never used, or deleted already) deletes nothing."""
        try:
            await self._session.authorized(run_id)
        except RunNotFound:
            return Deleted((), 0, 0)
        forks = Forks(self._session.store)
        done: Deleted = await self._session.available(lambda: forks.delete(run_id))
        log.info(
            "run.deleted", extra={"run_id": run_id, "rounds": len(done.run_ids), "actor": actor}
        )
        return done
