"""What ``explain`` says about who may take a versioned or class-bound run: the version
(or instance) it was admitted with, whether it waits for a worker of it, and the live
workers that carry which versions (or instances) of its flow, from their liveness keys
(``worker.carried``; docs/explanation/lifecycle.md)."""

from __future__ import annotations

from runfleet.broker.liveness import FleetMember
from runfleet.ops.cli.common import who
from runfleet.store.types import RunRow, RunStatus
from runfleet.worker.carried import read

_SHOWN = 5


def _takeable(row: RunRow) -> bool:
    """A run that waits for any worker to take it (not one parked on its own wait)."""
    return row.status is RunStatus.PENDING or (
        row.status is RunStatus.SUSPENDED
        and row.waiting is not None
        and row.waiting.reason == "released"
    )


def _serving(fleet: list[FleetMember], row: RunRow) -> list[FleetMember]:
    return [m for m in fleet if m.live and (not m.queues or row.queue in m.queues)]


def _listing(parts: list[str]) -> str:
    more = f" and {len(parts) - _SHOWN} more" if len(parts) > _SHOWN else ""
    return ", ".join(parts[:_SHOWN]) + more


def _quoted(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def version_lines(row: RunRow, fleet: list[FleetMember] | None) -> list[str]:
    """The run's version and the live workers of its queue that carry which versions of
    its flow (none when the run is unversioned)."""
    version = row.state.get("flow_version")
    if not isinstance(version, str):
        return []
    line = (
        f"version: admitted with version {version!r} of {row.flow}; only a worker whose "
        f"@flow carries {version!r} (or lists it as compatible) takes it"
    )
    waits = _takeable(row)
    if waits:
        line += f" — it waits for a worker of version {version!r}"
    out = [line + "."]
    if row.status.terminal:
        return out
    if fleet is None:
        out.append("workers: which live workers carry it is unknown (Redis did not answer).")
        return out
    carrying: list[str] = []
    other: list[str] = []
    for m in _serving(fleet, row):
        carried = (read(m.info, "versions") or {}).get(row.flow)
        if carried is None:
            continue  # not versioned there (an unversioned @flow takes any run), or absent
        named = f"{who(m.owner)} carries {_quoted(carried)}"
        (carrying if version in carried else other).append(named)
    if carrying:
        out.append(f"workers: {_listing(carrying)} — they take it.")
    else:
        others = f" (live: {_listing(other)})" if other else ""
        out.append(f"workers: no live worker of queue {row.queue!r} carries {version!r}{others}.")
    return out


def instance_lines(row: RunRow, fleet: list[FleetMember] | None) -> list[str]:
    """The instance a class-bound run was admitted for, and the live workers that have it."""
    name = row.state.get("flow_instance")
    if not isinstance(name, str):
        return []
    line = (
        f"instance: admitted for instance {name!r} of {row.flow}'s class; only a worker that "
        f"made an instance named {name!r}, declared for the run's scopes, runs it"
    )
    out = [line + "."]
    if row.status.terminal or fleet is None:
        return out
    having: list[str] = []
    other: list[str] = []
    for m in _serving(fleet, row):
        made = (read(m.info, "instances") or {}).get(row.flow)
        if made is None:
            continue
        (having if name in made else other).append(f"{who(m.owner)} has {_quoted(made)}")
    if having:  # by name: an instance's scopes are not advertised (run.instance_refused)
        out.append(f"workers: {_listing(having)} — they run it if its scopes allow.")
    elif _takeable(row):
        others = f" (live: {_listing(other)})" if other else ""
        out.append(f"workers: no live worker has instance {name!r} — it waits for one{others}.")
    return out
