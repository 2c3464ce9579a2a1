"""Conversions from database rows (dicts) to the typed rows of ``store.types``."""

from __future__ import annotations

from typing import Any

from runfleet.store.journal_records import Kind
from runfleet.store.types.dag import ParentEdge
from runfleet.store.types.journal import JournalRecord
from runfleet.store.types.run import Owner, RunRow, RunStatus, Waiting, WaitingReason, WaitingRow
from runfleet.store.types.waits import ClockRow, DeferredRow

Row = dict[str, Any]


def _owner(host: str | None, pid: Any, nonce: str) -> Owner | None:
    return None if host is None else Owner(host_id=host, pid=int(pid), nonce=nonce)


def run_row(row: Row) -> RunRow:
    waiting = None
    if row["waiting_reason"] is not None:
        waiting = Waiting(
            reason=WaitingReason(row["waiting_reason"]),
            wake_at_ms=row["waiting_wake_at_ms"],
            token=row["waiting_token"],
            request=row["waiting_request"],
        )
    state = row["state"] or {}
    if not isinstance(state, dict):  # an Undecodable (store/values.py): shown, never run
        state = {"state": state}
    # The exact texts of the payload and the result (store/values.py), decoded; rows
    # written before those columns existed keep theirs in ``state``. One copy of the
    # decoded state at most (three row conversions per run on a worker's hot path).
    payload, result = row.get("payload"), row.get("result")
    if payload is not None or result is not None:
        state = dict(state)
        if payload is not None:
            state["payload"] = payload
        if result is not None:
            state["result"] = result
    return RunRow(
        id=row["id"],
        flow=row["flow"],
        queue=row["queue"],
        status=RunStatus(row["status"]),
        state=state,
        owner=_owner(row["owner_host"], row["owner_pid"], row["owner_nonce"]),
        epoch=int(row["epoch"]),
        heartbeat_at_ms=row["heartbeat_at_ms"],
        claim=_owner(row["claim_host"], row["claim_pid"], row["claim_nonce"]),
        claimed_at_ms=row["claimed_at_ms"],
        cancel_requested_at_ms=row["cancel_requested_at_ms"],
        lineage_id=row["lineage_id"],
        round_ordinal=int(row["round_ordinal"]),
        parent_run_id=row["parent_run_id"],
        created_at_ms=int(row["created_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
        waiting=waiting,
        now_ms=int(row.get("now_ms") or 0),
        recoveries=int(row.get("recoveries") or 0),
        priority=int(row.get("priority") or 0),
        dedup_key=row.get("dedup_key"),
        concurrency_key=row.get("concurrency_key"),
        limited=bool(row.get("limited")),
    )


def waiting_row(row: Row) -> WaitingRow:
    return WaitingRow(
        run_id=row["run_id"],
        reason=WaitingReason(row["reason"]),
        wake_at_ms=row["wake_at_ms"],
        token=row["token"],
        request=row["request"],
        depth=int(row.get("depth") or 0),
    )


def deferred_row(row: Row) -> DeferredRow:
    return DeferredRow(
        run_id=row["run_id"],
        name=row["name"],
        value=row["value"],
        metadata=row["metadata"],
        completed_at_ms=int(row["completed_at_ms"]),
        consumed_at_ms=row["consumed_at_ms"],
        digest=row.get("digest"),
    )


def clock_row(row: Row) -> ClockRow:
    return ClockRow(
        run_id=row["run_id"],
        name=row["name"],
        deferred_name=row["deferred_name"],
        due_at_ms=int(row["due_at_ms"]),
        completed_at_ms=row["completed_at_ms"],
    )


def edge(row: Row) -> ParentEdge:
    return ParentEdge(child_id=row["child_id"], parent_id=row["parent_id"], seq=int(row["seq"]))


def _kind(stored: str) -> Kind | str:
    """A stored record's kind as a ``Kind``, or its string when this version knows none."""
    try:
        return Kind(stored)
    except ValueError:
        return stored


def journal_record(row: Row) -> JournalRecord:
    return JournalRecord(
        seq=int(row["seq"]),
        run_id=row["run_id"],
        kind=_kind(row["kind"]),
        source_id=row["source_id"],
        source_seq=int(row["source_seq"]),
        payload=row["payload"],
        at_ms=int(row["at_ms"]),
    )


def owner_params(owner: Owner, prefix: str = "") -> dict[str, Any]:
    return {
        f"{prefix}host": owner.host_id,
        f"{prefix}pid": owner.pid,
        f"{prefix}nonce": owner.nonce,
    }
