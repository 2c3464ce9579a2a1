"""What a flow body sees: its run, its arguments, and (later) its durable calls.

The Context is per drive (one activation at one epoch). Durable operations —
steps, sleeps, waits, children — are methods here so that replay can key them by
call order; this first version offers identity, payload and cancellation checks.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from store.types import Owner, RunRow


class Interrupted(asyncio.CancelledError):
    """Raised into a flow whose run this process must stop executing.

    ``cause`` is ``cancelled`` (a cancel request: commit ``cancelled``),
    ``lost-fence`` (another owner holds the run: write nothing), ``lease-lapsed``
    or ``shutdown`` (release the run so another worker resumes it).
    """

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass
class Context:
    run: RunRow
    owner: Owner
    epoch: int
    log: logging.LoggerAdapter[logging.Logger] = field(init=False)
    _interrupt: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.log = logging.LoggerAdapter(
            logging.getLogger("runfleet.flow"), {"run_id": self.run.id, "flow": self.run.flow}
        )

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def args(self) -> list[Any]:
        payload = self.run.payload or {}
        return list(payload.get("args") or [])

    @property
    def kwargs(self) -> dict[str, Any]:
        payload = self.run.payload or {}
        return dict(payload.get("kwargs") or {})

    @property
    def interrupted(self) -> str | None:
        """Why this drive must stop, once an interrupt was requested (for sync bodies)."""
        return self._interrupt

    def check(self) -> None:
        """Raise Interrupted if the drive was interrupted; sync bodies call it at safe points."""
        if self._interrupt is not None:
            raise Interrupted(self._interrupt)
