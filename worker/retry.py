"""Retrying infrastructure failures (database or Redis unreachable) with backoff.

Retries are for the network and the servers, never for a lost race: those are
outcomes. What counts as infrastructure is decided once, in ``store.transient``.
Every retry is logged and counted so an outage is visible, not silent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import runfleet.worker.metrics as metrics
from runfleet.store.transient import TRANSIENT_TYPES, is_transient, retrying
from runfleet.store.types.outcomes import RowLocked

log = logging.getLogger("runfleet.worker.retry")
T = TypeVar("T")

INFRA_ERRORS: tuple[type[BaseException], ...] = TRANSIENT_TYPES
"""Every exception type that may be infrastructure trouble, for ``except`` clauses
(``is_transient`` tells a READONLY reply from a WRONGTYPE one within them)."""

__all__ = ["INFRA_ERRORS", "durable_call", "is_transient", "until_row_free", "with_retry"]

SET_ASIDE_PAUSE_MAX = 1.0
"""The longest pause between two tries of a write set aside on a locked row
(``until_row_free``): the write lands within about this long of the row's release."""

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


async def until_row_free(
    component: str, run_id: str, fn: Callable[[], Awaitable[T | RowLocked]]
) -> T:
    """``with_retry(fn)`` until it answers something else than ``RowLocked``.

    ``RowLocked``: the write gave up on the run's row after ``worker_lock_wait_ms``
    (another transaction holds it; a producer may lock its own run), wrote nothing and
    holds no connection. The run is set aside (``run.set_aside``, once) and the write
    tried again after a pause (0.05 s, doubling to ``SET_ASIDE_PAUSE_MAX``): this run
    waits for its row, and no other run's statement waits with it. A lock race is not an
    outage: none of this is counted or retried as infrastructure trouble.
    """
    pause, logged = 0.05, False
    while True:
        outcome = await with_retry(component, fn)
        if not isinstance(outcome, RowLocked):
            return outcome
        if not logged:
            log.info("run.set_aside", extra={"run_id": run_id, "write": component})
            logged = True
        await asyncio.sleep(pause)
        pause = min(2 * pause, SET_ASIDE_PAUSE_MAX)


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
