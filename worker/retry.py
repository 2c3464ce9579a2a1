"""Retrying infrastructure failures (database or Redis unreachable) with backoff.

Retries are for the network and the servers, never for a lost race: those are
outcomes. What counts as infrastructure is decided once, in ``store.transient``.
Every retry is logged and counted so an outage is visible, not silent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import runfleet.worker.metrics as metrics
from runfleet.store.transient import TRANSIENT_TYPES, is_transient, retrying

log = logging.getLogger("runfleet.worker.retry")
T = TypeVar("T")

INFRA_ERRORS: tuple[type[BaseException], ...] = TRANSIENT_TYPES
"""Every exception type that may be infrastructure trouble, for ``except`` clauses
(``is_transient`` tells a READONLY reply from a WRONGTYPE one within them)."""

__all__ = ["INFRA_ERRORS", "durable_call", "is_transient", "with_retry"]

DURABLE_GIVE_UP_S = 120.0
"""How long a flow's bookkeeping call keeps retrying while its lease still holds.

Normally the lease decides first: with the database unreachable the heartbeat fails
too, the process lapses and ``check`` interrupts the call within ``lapse_after``. This
bound only matters when renewals still get through but this call keeps failing; the
error then escapes as transient and the driver releases the run instead of failing it.
"""


def _log_retry(component: str, run_id: str | None = None) -> Callable[[int, BaseException], None]:
    def on_retry(attempt: int, exc: BaseException) -> None:
        metrics.INFRA_ERRORS.labels(component).inc()
        extra: dict[str, object] = {"component": component, "attempt": attempt, "error": repr(exc)}
        if run_id is not None:
            extra["run_id"] = run_id
        log.warning("infra.retry", extra=extra)

    return on_retry


async def with_retry(
    component: str, fn: Callable[[], Awaitable[T]], *, give_up_after: float = 60.0
) -> T:
    """Call ``fn`` until it succeeds, retrying infrastructure errors with jittered backoff."""
    return await retrying(
        fn, give_up_after=give_up_after, on_retry=_log_retry(component), max_wait=2.0
    )


async def durable_call(
    component: str,
    fn: Callable[[], Awaitable[T]],
    *,
    check: Callable[[], None],
    run_id: str,
    give_up_after: float | None = None,
) -> T:
    """A flow's bookkeeping call: retried while ``check`` lets the run go on.

    ``check`` raises ``Interrupted`` once the run must stop (cancelled, lease lapsed,
    fence lost, shutdown), which ends the retrying: the driver then releases the run
    or writes nothing, and another attempt takes it from its records.
    """
    return await retrying(
        fn,
        give_up_after=DURABLE_GIVE_UP_S if give_up_after is None else give_up_after,
        check=check,
        on_retry=_log_retry(f"flow:{component}", run_id),
    )
