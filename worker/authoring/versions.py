"""Flow versions: which code a run was admitted with, who may run it, and ``ctx.patched``.

Deploying new flow code while old runs are in flight is the hard part of durable
execution: a run replays its recorded history against whatever code resumes it. So a
flow may declare a version (``@flow(version="v2")``, or ``version="auto"``: a digest of
the function's code), and the versions it can still replay (``compatible=("v1",)``).

- A producer admits each run with its flow's version (``state.flow_version``; a run
  enqueued by name alone has none and is any worker's).
- A worker takes only runs of a version it carries: ``Flow.accepts``. A run of another
  version is left to the workers that carry it (``run.version_not_carried``, logged once
  per run), never claimed, stolen or woken here; its wake is handed on to them
  (``worker.hand_on``); ``runfleet explain`` says it waits for one.
- ``ctx.patched("id")`` (Temporal's model) branches old and new histories safely: True in
  a new execution (it records a marker), and on replay True only where the history has
  that marker. Where an old history has another call, it answers False and takes no
  position, so the old branch replays exactly as recorded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runfleet.store import validate

if TYPE_CHECKING:
    from runfleet.worker.unrunnable import Unrunnable

log = logging.getLogger("runfleet.worker.flows")

AUTO = "auto"
PATCH_KIND = "patch"


def code_version(fn: Callable[..., Any]) -> str:
    """``version="auto"``: a digest of the function's code (bytecode, constants, names)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{fn!r} has no code to digest: give @flow an explicit version")
    parts = [code.co_code, repr(code.co_consts).encode(), repr(code.co_names).encode()]
    return "auto:" + hashlib.sha256(b"\x00".join(parts)).hexdigest()[:12]


def declared(fn: Callable[..., Any], version: str | None) -> str | None:
    """The version ``@flow`` records for ``fn``: as given, or its code's digest for AUTO."""
    if version is None:
        return None
    if version == AUTO:
        return code_version(fn)
    return validate.identifier("version", version)


if TYPE_CHECKING:
    from runfleet.worker.authoring.replay import Replay


class Versions:
    """``Context.patched``: the branch a patch added, taken only where history allows."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    async def patched(self, patch_id: str) -> bool:
        """Whether this execution takes the code path added by patch ``patch_id``.

        New executions (past the recorded history) record a marker and answer True; a
        replay answers True where its history has that marker, False where it has
        another call (the run was recorded by code without the patch): then nothing is
        recorded and no position is taken, so the old branch replays as it was.
        """
        validate.identifier("patch id", patch_id)
        recorded = self._replay.peek()
        if recorded is not None and not (recorded.kind == PATCH_KIND and recorded.name == patch_id):
            return False  # an old history: the call here is the unpatched code's
        call = await self._replay.next(PATCH_KIND, patch_id)
        position, key, record = call.position, call.key, call.record
        if record is None:
            await self._replay.record(position, key, patch_id, PATCH_KIND, {"patch": patch_id})
        return True


VERSION_STATE_KEY = "flow_version"
"""Where a run's state keeps the version it was admitted with."""


def admitted_version(row: Any) -> str | None:
    value = row.state.get(VERSION_STATE_KEY)
    return value if isinstance(value, str) else None


def version_carried(flow: Any, row: Any, warned: Unrunnable) -> bool:
    """Whether this process's ``flow`` may run ``row``; logs ``run.version_not_carried``
    once per run (``warned`` bounds the memory of that, as for unknown flows)."""
    version = admitted_version(row)
    if flow.accepts(version):
        return True
    carried = ", ".join(v for v in (flow.version, *flow.compatible) if v)
    if warned.first(row.id, f"admitted with version {version}; this worker carries {carried}"):
        log.warning(
            "run.version_not_carried",
            extra={
                "run_id": row.id,
                "flow": row.flow,
                "version": version,
                "carried": [flow.version, *flow.compatible],
            },
        )
    return False


def child_version(flow: Any) -> str | None:
    """A child's ``flow_version``: the version of the ``@flow`` object it was started with."""
    version = getattr(flow, "version", None)
    return version if isinstance(version, str) else None
