"""The step bookkeeping every run of one process shares: attempt starts and records.

Flows running side by side reach their steps at nearly the same moments; each step
costs two fenced writes (number the attempt before the body runs, record the output
after). Here the writes of concurrent runs that become ready together share one
statement (``GroupCommit``), each still fenced by its own run and epoch and answering
its own outcome, so a busy process pays per batch what an idle one pays per step.
"""

from __future__ import annotations

from collections.abc import Sequence

from runfleet.runtime.batching import GroupCommit
from runfleet.store import Store
from runfleet.store.steps import StepRecord, StepWrite
from runfleet.store.types import Owner
from runfleet.store.values import UnstorableValue


class Bookkeeping:
    def __init__(self, store: Store, owner: Owner) -> None:
        self._store = store
        self._owner = owner
        self._starts: GroupCommit[tuple[str, int, str], int | None] = GroupCommit(
            self._start_many, name="attempt-start"
        )
        self._records: GroupCommit[StepWrite, StepRecord | None] = GroupCommit(
            self._record_many, name="step-record", isolate=(UnstorableValue,)
        )

    async def start_attempt(self, run_id: str, epoch: int, key: str) -> int | None:
        """The attempt number now started, or None when the fence is gone."""
        return await self._starts.submit((run_id, epoch, key))

    async def record(self, write: StepWrite) -> StepRecord | None:
        """The record written, or None when the fence (or the position) is gone.

        UnstorableValue is raised to this caller alone, before anything joins a batch.
        """
        self._store.steps.encode(write)
        return await self._records.submit(write)

    async def _start_many(self, steps: Sequence[tuple[str, int, str]]) -> list[int | None]:
        return await self._store.steps.start_attempts(self._owner, steps)

    async def _record_many(self, writes: Sequence[StepWrite]) -> list[StepRecord | None]:
        return await self._store.steps.record_many(self._owner, writes)
