"""What ``Context``'s mixins (``worker.waits.Waits``, ``worker.children.Children``) use of it.

One declaration for both: the fields they read and, for mypy only, the replay
bookkeeping ``worker.context.Context`` defines (``_next``, ``_record``, ``_park``...).
At run time this class adds nothing: the fields and methods are the Context's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.steps import StepRecord
from runfleet.store.types import RunRow, Waiting
from runfleet.worker.durable import Call
from runfleet.worker.wake_hints import HintFn

T = TypeVar("T")


class ContextParts:
    """The part of ``Context`` its mixins rely on."""

    run: RunRow
    settings: Settings | None
    wake_hint: float | None
    hint: HintFn | None

    if TYPE_CHECKING:  # for mypy only: worker.context.Context defines these

        @property
        def _store(self) -> Store: ...

        async def _durable(self, what: str, call: Callable[[], Awaitable[T]]) -> T: ...

        async def _next(self, kind: str, name: str) -> Call: ...

        async def _record(
            self,
            position: int,
            key: str,
            name: str,
            kind: str,
            output: Any,
            compensate: str | None = None,
            attempt: int | None = None,
        ) -> StepRecord: ...

        async def _park(self, waiting: Waiting, deferred: str | None = None) -> None: ...

        async def _deferred(self, name: str) -> Any: ...

        async def _now_ms(self) -> int: ...

        async def _ensure_clock(self, name: str, due_at_ms: int) -> int: ...
