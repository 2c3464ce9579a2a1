"""Producer calls that act on a run's history: resume it, fork it, delete it.

``RunHistory`` is ``AsyncQueue``'s half for them (``broker.queue.AsyncQueue`` inherits
it). Postgres decides (``store.forks``); the new run's stream message is only a hint.
Each writes rows a producer role may not write (recorded steps, every table of a run):
run them as a role that may (the worker's or the migrator's), as ``runfleet`` does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from runfleet.broker.run import AsyncRun
from runfleet.broker.streams import Lane
from runfleet.store.forks import Deleted, Forks

if TYPE_CHECKING:
    from runfleet.store import Store
    from runfleet.store.types import RunRow

log = logging.getLogger("runfleet.broker.queue")


class RunHistory:
    """``AsyncQueue``'s calls on a run's history."""

    if TYPE_CHECKING:  # defined by AsyncQueue / RunControl

        @property
        def store(self) -> Store: ...

        async def authorized(self, run_id: str) -> RunRow: ...

        async def _available(self, call: Any, *, retried: Any = None) -> Any: ...

        async def _publish_ready(self, rows: list[RunRow], *, lane: Lane) -> None: ...

    async def resume_run(self, run_id: str, *, actor: str | None = None) -> AsyncRun:
        """Resume a failed or cancelled run from its recorded calls (DBOS resume_workflow).

        A new round of its lineage replays them and runs on from the first one not
        recorded; the settled round stays settled (``resumed_as``). Resuming again while
        that round is open joins it.
        """
        await self.authorized(run_id)
        forks = Forks(self.store)
        new: RunRow = await self._available(lambda: forks.resume(run_id, actor=actor))
        await self._publish_ready([new], lane=Lane.NORMAL)
        return AsyncRun(self, new.id)  # type: ignore[arg-type]

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
        await self.authorized(run_id)
        forks = Forks(self.store)
        new: RunRow = await self._available(
            lambda: forks.fork(run_id, upto=from_step, new_id=new_run_id, actor=actor)
        )
        await self._publish_ready([new], lane=Lane.NORMAL)
        return AsyncRun(self, new.id)  # type: ignore[arg-type]

    async def delete_run(self, run_id: str, *, actor: str | None = None) -> Deleted:
        """Delete a settled run — every round of its lineage — and all that is theirs."""
        await self.authorized(run_id)
        forks = Forks(self.store)
        done: Deleted = await self._available(lambda: forks.delete(run_id))
        log.info(
            "run.deleted", extra={"run_id": run_id, "rounds": len(done.run_ids), "actor": actor}
        )
        return done
