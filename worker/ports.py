"""What the driver is handed: the rest of the worker process, as three named ports.

The driver decides and executes runs against the store; everything else it tells or asks
goes through one of these, which the worker process builds and passes in
(``worker.process``) and a test replaces with a recording one or leaves out (None: no
Redis, a lease taken as held, no limited queues to pump). Each is a Protocol, so the
process's own objects serve as they are: the ``Outbox`` is the ``Hints``, the
``LeaseGate`` the ``LeaseView``.
"""

from __future__ import annotations

from typing import Protocol

from runfleet.store.types import RunRow, RunStatus


class Hints(Protocol):
    """What the driver tells Redis about runs: wakes, the queue gates, settlements.

    Only hints: a lost one delays a run until a sweep finds it, never decides it.
    """

    async def hint(self, row: RunRow) -> None:
        """A run can move now (released, a child admitted, a parent woken)."""

    async def hint_front(self, row: RunRow) -> None:
        """As ``hint``, on the recovery lane read before the backlog: a run whose delivery
        a higher-priority run took keeps its place (docs/how-to/queues.md)."""

    async def gate(self, row: RunRow) -> None:
        """Park the wake of a run its queue's concurrency or rate limit refused."""

    async def started(self, row: RunRow) -> None:
        """A limited queue's run started here: a wake of it parked at the gate is stale."""

    async def settled(self, run_id: str, status: RunStatus) -> None:
        """Announce a committed settlement to the producers waiting on it."""


class LeaseView(Protocol):
    """This process's lease as the driver reads it (``worker.lease.LeaseGate``)."""

    def open(self) -> bool:
        """Whether the process may act for its runs now (claim, steal, record)."""

    def unconfirmed_ms(self) -> int | None:
        """How long the lease went unconfirmed in its newest lapse (a lapse release
        journals it); None if it never lapsed."""


class Slots(Protocol):
    """The capacity of limited queues: when a gated wake may move."""

    def slot_freed(self, queue: str) -> None:
        """An execution of a limited queue ended here: one gated wake of it may move."""

    def rate_due(self, queue: str, after_ms: int) -> None:
        """A rate refused a claim of ``queue``, its next token due in ``after_ms``: pump
        the queue's gate from then on (``worker.rate_pump``)."""
