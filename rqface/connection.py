"""What rq's ``Job``, its registries and an ``is_async=False`` job use of the ``Queue`` they
were read through (rq's ``connection=``).

The synchronous ``Queue`` (``rqface.sync``) makes jobs and registries; they reach back to
it only through this interface, so ``rqface.jobs`` and ``rqface.registries`` sit beneath
``rqface.sync`` and import nothing above them.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from runfleet.producer.queue import AsyncQueue
from runfleet.rqface.rq_queue import RqReads
from runfleet.store.types import CancelOutcome

T = TypeVar("T")


class Connection(Protocol):
    """A runfleet ``Queue`` as its jobs and registries call it."""

    _async: AsyncQueue
    """The queue whose calls run on the loop thread (``_call``)."""
    _rq: RqReads
    """rq's registry reads and markers (``rqface.rq_queue``)."""

    @property
    def name(self) -> str: ...

    @property
    def settings_key(self) -> tuple[str, str, str]:
        """What makes two queues the same store."""
        ...

    @property
    def failed_job_registry(self) -> Any:
        """rq's ``FailedJobRegistry`` of this queue."""
        ...

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` on the loop thread, waited for."""
        ...

    def _now(self, call: Callable[[AsyncQueue], Coroutine[Any, Any, T]]) -> T:
        """A call that is one statement and never waits, driven in the caller's thread."""
        ...

    def _settled_shared(self) -> bool:
        """Whether the loop thread's shared settled subscription is up (a hint)."""
        ...

    def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome: ...

    def get_job_position(self, job_or_id: Any) -> int | None: ...

    def sibling(self, name: str) -> Connection:
        """The queue called ``name`` on this one's settings (rq's ``Queue(name, connection=)``)."""
        ...
