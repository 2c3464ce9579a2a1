"""What a Postgres server says about its place in a replicated cluster.

``runfleet doctor`` reports it (primary or standby, which standbys stream and whether a
commit waits for them, how far behind they replay), and read-only commands pointed at a
replica (``RUNFLEET_READ_DATABASE_URL``) show the replica's lag with their answer.

Why it matters: with asynchronous replication a commit is acknowledged before any
standby has it, and a failover to that standby loses it — an admission a producer saw
succeed, a step record (so the step runs again). ``synchronous_standby_names`` with
``synchronous_commit`` at ``on`` (or ``remote_write``/``remote_apply``) closes that
window; ``commits_wait_for_standby`` says whether it is closed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from runfleet.store.db import Database

WAITING_COMMITS = frozenset({"on", "remote_write", "remote_apply"})
"""``synchronous_commit`` values that make a commit wait for a synchronous standby."""


class Role(enum.StrEnum):
    PRIMARY = "primary"
    STANDBY = "standby"


@dataclass(frozen=True)
class Standby:
    name: str
    client: str
    state: str | None
    sync_state: str | None
    """``sync``, ``potential``, ``quorum`` or ``async`` (pg_stat_replication); None when
    the role may not read it (without pg_monitor, Postgres shows another session's
    replication columns as NULL): unknown, never taken for ``async``."""
    replay_lag_s: float | None
    replay_behind_bytes: int | None

    @property
    def synchronous(self) -> bool:
        return self.sync_state in ("sync", "quorum")


@dataclass(frozen=True)
class Topology:
    role: Role
    synchronous_commit: str
    synchronous_standby_names: str
    standbys: tuple[Standby, ...]
    """On a primary: who streams from it."""
    replay_lag_s: float | None
    """On a standby: the age of the last transaction it replayed."""
    receive_behind_bytes: int | None
    upstream: str | None
    """On a standby: the server it streams from."""
    timeline: int | None
    """None when the role may not read it."""

    @property
    def standbys_readable(self) -> bool:
        """Whether this role can see each standby's sync state (pg_monitor, or superuser)."""
        return all(s.sync_state is not None for s in self.standbys)

    @property
    def commits_wait_for_standby(self) -> bool:
        """Whether an acknowledged commit is on a synchronous standby too (no loss on
        failover to it): a sync standby streams and commits wait for it."""
        return self.may_wait_for_standby and any(s.synchronous for s in self.standbys)

    @property
    def may_wait_for_standby(self) -> bool:
        """Whether the settings ask commits to wait for a synchronous standby (whether one
        streams is what ``standbys`` says)."""
        return self.synchronous_commit in WAITING_COMMITS and bool(
            self.synchronous_standby_names.strip()
        )


async def read_topology(db: Database) -> Topology:
    row = await db.one("topology.server")
    assert row is not None
    role = Role.STANDBY if row["in_recovery"] else Role.PRIMARY
    standbys: tuple[Standby, ...] = ()
    if role is Role.PRIMARY:
        standbys = tuple(
            Standby(
                name=str(r["name"]),
                client=str(r["client"]),
                state=_str(r["state"]),
                sync_state=_str(r["sync_state"]),
                replay_lag_s=_float(r["replay_lag_s"]),
                replay_behind_bytes=_int(r["replay_behind_bytes"]),
            )
            for r in await db.all("topology.standbys")
        )
    try:
        found = await db.one("topology.timeline")
        timeline = _int(found["timeline"]) if found else None
    except psycopg.errors.InsufficientPrivilege:
        timeline = None
    return Topology(
        role=role,
        synchronous_commit=str(row["synchronous_commit"]),
        synchronous_standby_names=str(row["synchronous_standby_names"]),
        standbys=standbys,
        replay_lag_s=_float(row["replay_lag_s"]),
        receive_behind_bytes=_int(row["receive_behind_bytes"]),
        upstream=None if row["upstream"] is None else str(row["upstream"]),
        timeline=timeline,
    )


async def missing_runs(db: Database, ids: Sequence[str]) -> list[str]:
    """The ids among ``ids`` this database has no run for."""
    if not ids:
        return []
    present = {str(r["id"]) for r in await db.all("topology.present_runs", {"ids": list(ids)})}
    return sorted(set(ids) - present)


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _float(value: object) -> float | None:
    return None if value is None else float(str(value))


def _int(value: object) -> int | None:
    return None if value is None else int(str(value))
