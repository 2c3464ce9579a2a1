"""The next round of a lineage: the one way a ``NewRun`` continues a run's lineage.

Three paths admit a round after ``previous``: a handoff (``worker.settle``: the flow it
names, new arguments, the lineage's parent kept), an rq-style requeue of a failed run
(``store.jobs``) and a resume of a failed or cancelled one (``store.forks``: both the
same flow and payload again). Each round's id is ``<lineage>@<ordinal>``, it names the
round it continues, keeps the scopes and the lineage's ``max_rounds`` budget; what
differs is passed in.
"""

from __future__ import annotations

from runfleet.store.types.options import AdmissionOptions
from runfleet.store.types.run import JsonValue, NewRun, OnParentExit, RunRow


def round_id(lineage_id: str, ordinal: int) -> str:
    return f"{lineage_id}@{ordinal}"


def next_ordinal(previous: RunRow, latest: RunRow | None) -> int:
    """The ordinal after the lineage's newest round (``latest``; else after ``previous``)."""
    return (latest.round_ordinal if latest is not None else previous.round_ordinal) + 1


def next_round(
    previous: RunRow,
    ordinal: int,
    *,
    flow: str | None = None,
    queue: str | None = None,
    payload: JsonValue | None = None,
    max_rounds: int | None = None,
    in_family: bool = False,
    options: AdmissionOptions | None = None,
    deadline_ms: int | None = None,
    timeout_ms: int | None = None,
) -> NewRun:
    """The ``NewRun`` of round ``ordinal`` of ``previous``'s lineage.

    ``flow``, ``queue`` and ``payload`` default to ``previous``'s (a requeue, a resume);
    ``max_rounds`` to the lineage's recorded budget. ``in_family``: the round stays the
    child of ``previous``'s parent, with its exit policy (a handoff carries the lineage
    on; a requeue or a resume is an operator's new start).
    """
    return NewRun(
        id=round_id(previous.lineage_id, ordinal),
        flow=flow if flow is not None else previous.flow,
        queue=queue if queue is not None else previous.queue,
        payload=payload if payload is not None else previous.payload,
        scopes=previous.scopes,
        parent_id=previous.parent if in_family else None,
        on_parent_exit=previous.on_parent_exit if in_family else OnParentExit.CANCEL,
        lineage_id=previous.lineage_id,
        previous_round_id=previous.id,
        round_ordinal=ordinal,
        max_rounds=max_rounds if max_rounds is not None else previous.max_rounds,
        deadline_ms=deadline_ms,
        timeout_ms=timeout_ms,
        options=options or AdmissionOptions(),
    )
