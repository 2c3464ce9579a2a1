"""One constructor per way an owned run ends: the ``Settle`` each outcome commits.

River's ``JobSetStateCompleted`` / ``…Cancelled`` and Oban's engine name each ending
once; so does this module. A caller says which ending (``completed``, ``failed``,
``cancelled``, ``lineage_exhausted``, ``round_invalid``) with that ending's own fields,
and gets the status, state patch and typed journal record (``store.journal_records``,
its kind with it) it implies, which ``Lifecycle.settle`` (one) or
``Lifecycle.settle_many`` (a batch) commits under the owner/epoch fence. No caller
assembles ``transition_owned``'s keywords itself.
"""

from __future__ import annotations

from typing import Any

import runfleet.store.journal_records as jr
from runfleet.store.types.failure import RunError
from runfleet.store.types.outcomes import Settle
from runfleet.store.types.run import Owner, RunStatus


def journaled(item: Settle) -> jr.Settled:
    """The record ``item`` journals: its own, or a plain ``transitioned``, ``to`` and
    ``epoch`` the item's."""
    return jr.settled_record(item.record, item.status, item.epoch)


def completed(run_id: str, epoch: int, result: Any) -> Settle:
    """The body returned ``result``: settled completed, cancel-guarded."""
    status = RunStatus.COMPLETED
    return Settle(
        run_id, epoch, status, {"result": result}, jr.Transitioned(to=status, epoch=epoch)
    )


def failed(run_id: str, epoch: int, error: RunError) -> Settle:
    """The body raised (``error`` as ``worker.settle.error_of`` records it)."""
    status = RunStatus.FAILED
    patch = {"error": error.to_json()}
    return Settle(run_id, epoch, status, patch, jr.Transitioned(to=status, epoch=epoch))


def cancelled(run_id: str, epoch: int, me: Owner, *, found_at: str | None = None) -> Settle:
    """The owner closes a run whose cancel was asked (compensations already ran).

    Unguarded: it is the cancel. ``found_at``: the interrupt (shutdown, lapse) whose
    release found the cancel request instead of delivering it (kept in the cancellation
    and its record).
    """
    status = RunStatus.CANCELLED
    found = {} if found_at is None else {"found_at_release": found_at}
    return Settle(
        run_id,
        epoch,
        status,
        {"cancellation": {"acknowledged_by": me.key, **found}},
        jr.Interrupted(to=status, epoch=epoch, cancelled=True, found_at_release=found_at),
        guard=False,
    )


def lineage_exhausted(run_id: str, epoch: int, max_rounds: int) -> Settle:
    """A handoff past the lineage's ``max_rounds``: the round fails, no successor."""
    status = RunStatus.FAILED
    error = RunError(type="LineageExhausted", message=f"max_rounds={max_rounds} reached")
    return Settle(
        run_id,
        epoch,
        status,
        {"error": error.to_json()},
        jr.LineageExhausted(to=status, epoch=epoch, max_rounds=max_rounds),
    )


def round_invalid(run_id: str, epoch: int, error: RunError, successor: str) -> Settle:
    """A handoff no next round can be made from (an unknown flow, a malformed handoff,
    arguments the flow does not take, the successor's id taken): the round fails once."""
    status = RunStatus.FAILED
    return Settle(
        run_id,
        epoch,
        status,
        {"error": error.to_json()},
        jr.RoundInvalid(to=status, epoch=epoch, successor=successor),
    )
