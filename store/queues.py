"""Per-queue settings (``runfleet.queues``): the default priority, changed live.

A change is one statement that writes the settings and appends the change with the
authenticated role that made it (``runfleet.queue_changes``): who changed a queue is the
database's answer, never a caller-supplied name. Admission reads the default priority in
its own statement (the ``runs_default_priority`` trigger), so a change applies to the
next admission on every producer at once, with no process to restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

import runfleet.store.validate as validate
from runfleet.store.db import Database
from runfleet.store.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class QueueSettings:
    name: str
    default_priority: int
    concurrency: int | None
    """Fleet-wide: at most this many of its runs execute at once (None: no limit)."""
    rate_per_s: float | None
    """Fleet-wide: at most this many starts per second (a token bucket of one second's)."""
    updated_at_ms: int
    updated_by: str
    """The database role that made the latest change."""
    keyed: bool = False
    """Its slots are shared round-robin across concurrency keys (docs/how-to/queues.md)."""
    key_concurrency: int | None = None
    """At most this many runs of one key execute at once (None: no per-key limit)."""
    key_rate_per_s: float | None = None
    """At most this many starts per second per key (None: no per-key rate)."""


NO_KEY = ""
"""The key every unkeyed run of a keyed queue shares (migration 0029): it takes its turn,
its K and its per-key rate like any key. No payload or scope yields it (an empty value
is no key), so no tenant's runs share it by chance."""


def key_label(key: str) -> str:
    """A key as an operator reads it: the no-key bucket is ``(no key)``."""
    return "(no key)" if key == NO_KEY else key


@dataclass(frozen=True, slots=True)
class KeyState:
    """One concurrency key of a keyed queue, as ``Queues.keys`` reads it."""

    key: str
    last_start_ms: int
    running: int
    """Its runs executing now: the key's slots in use."""
    waiting: int
    """Its fresh admissions not started yet."""
    wait_ms: int | None
    """Until the key's rate allows a start (0: now; None: no key rate)."""

    @property
    def label(self) -> str:
        return key_label(self.key)


FLOW_KEY_EXPRESSION = re.compile(r"scope|kwargs\.[A-Za-z_][A-Za-z0-9_]{0,99}|args\.[0-9]{1,3}")
"""A flow's key expression (the CHECK of runfleet.flow_keys, migration 0019)."""


@dataclass(frozen=True, slots=True)
class QueueChange:
    queue: str
    change: dict[str, Any]
    note: str | None
    changed_by: str
    at_ms: int


def _settings(row: dict[str, Any]) -> QueueSettings:
    return QueueSettings(
        row["name"],
        int(row["default_priority"]),
        row["concurrency"],
        row["rate_per_s"],
        int(row["updated_at_ms"]),
        row["updated_by"],
        bool(row.get("keyed")),
        row.get("key_concurrency"),
        row.get("key_rate_per_s"),
    )


class Queues:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def set(
        self,
        name: str,
        *,
        default_priority: int | None = None,
        concurrency: int | None = None,
        rate_per_s: float | None = None,
        key_concurrency: int | None = None,
        key_rate_per_s: float | None = None,
        key_flow: tuple[str, str] | None = None,
        note: str | None = None,
    ) -> QueueSettings:
        """Change the settings given (the others stay), journaled with who changed them.

        ``concurrency``: the fleet-wide limit, applied by the next claim of every worker
        (it is read in the claim statement); 0 lifts it. Runs already executing beyond a
        lowered limit finish; no new one starts until the count is under it.

        ``key_flow``: ``(flow, expression)``, the flow's concurrency key from now on
        (``scope``, ``kwargs.NAME`` or ``args.N``; computed by the database at admission),
        and the queue becomes keyed: its slots are shared round-robin across keys.
        ``key_concurrency`` / ``key_rate_per_s``: the same limits per key (0 lifts).
        """
        validate.identifier("queue", name)
        change: dict[str, Any] = {}
        if default_priority is not None:
            change["default_priority"] = validate.priority(default_priority, "default_priority")
        if concurrency is not None:
            change["concurrency"] = _limit("concurrency", concurrency) or None
        if rate_per_s is not None:
            change["rate_per_s"] = _rate("rate", rate_per_s) or None
        if key_concurrency is not None:
            change["key_concurrency"] = _limit("key_concurrency", key_concurrency) or None
        if key_rate_per_s is not None:
            change["key_rate_per_s"] = _rate("key_rate", key_rate_per_s) or None
        if key_flow is not None:
            flow, expression = key_flow
            validate.identifier("flow", flow)
            if not FLOW_KEY_EXPRESSION.fullmatch(expression):
                raise InvalidInput(
                    "key", "the key expression is scope, kwargs.NAME or args.N (e.g. kwargs.tenant)"
                )
            change["key"] = {"flow": flow, "expression": expression}
        if not change:
            raise InvalidInput("settings", "name at least one setting to change")
        row = await self._db.one(
            "queues.set",
            {
                "name": name,
                "default_priority": default_priority,
                "concurrency": concurrency,
                "rate_per_s": None if rate_per_s is None else float(rate_per_s),
                "key_concurrency": key_concurrency,
                "key_rate_per_s": None if key_rate_per_s is None else float(key_rate_per_s),
                "key_flow": None if key_flow is None else key_flow[0],
                "key_expression": None if key_flow is None else key_flow[1],
                "change": Jsonb(change),
                "note": note,
            },
        )
        assert row is not None  # an upsert always returns its row
        return _settings(row)

    async def get(self, name: str) -> QueueSettings | None:
        row = await self._db.one("queues.get", {"name": name})
        return _settings(row) if row else None

    async def all(self) -> list[QueueSettings]:
        return [_settings(r) for r in await self._db.all("queues.all")]

    async def wait_ms(self, name: str) -> int | None:
        """Milliseconds until the queue's rate allows a start (0: now; None: no rate)."""
        row = await self._db.one("queues.wait", {"name": name})
        return None if row is None or row["wait_ms"] is None else int(row["wait_ms"])

    async def bucket(self, name: str) -> tuple[int, float] | None:
        """Whole tokens in the queue's rate bucket now, and its rate (None: no rate)."""
        row = await self._db.one("queues.bucket", {"name": name})
        if row is None or row["tokens"] is None:
            return None
        return int(row["tokens"]), float(row["rate_per_s"])

    async def keys(self, name: str, key: str | None = None, limit: int = 20) -> list[KeyState]:
        """The queue's concurrency keys in round-robin order (the next turn first)."""
        rows = await self._db.all("queues.keys", {"name": name, "key": key, "limit": limit})
        return [
            KeyState(
                r["key"],
                int(r["last_start_ms"]),
                int(r["running"]),
                int(r["waiting"]),
                None if r["wait_ms"] is None else int(r["wait_ms"]),
            )
            for r in rows
        ]

    async def flow_keys(self) -> dict[str, str]:
        """Each keyed flow's key expression."""
        return {r["flow"]: r["expression"] for r in await self._db.all("queues.flow_keys")}

    async def running(self, names: list[str]) -> dict[str, int]:
        """How many runs of each of ``names`` execute now (0 for the others)."""
        rows = await self._db.all("queues.running", {"names": names})
        found = {r["queue"]: int(r["running"]) for r in rows}
        return {name: found.get(name, 0) for name in names}

    async def changes_readable(self) -> bool:
        """Whether this role may read ``changes`` (a scoped operator may not)."""
        row = await self._db.one("queues.changes_readable")
        return bool(row and row["readable"])

    async def changes(self, name: str, limit: int = 20) -> list[QueueChange]:
        """The queue's latest changes, newest first."""
        rows = await self._db.all("queues.changes", {"name": name, "limit": limit})
        return [
            QueueChange(r["queue"], r["change"], r["note"], r["changed_by"], int(r["at_ms"]))
            for r in rows
        ]


def _limit(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, "must be an integer")
    if not 0 <= value <= 1_000_000:
        raise InvalidInput(field, "must be between 0 (no limit) and 1000000")
    return value


def _rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(field, "must be a number of starts per second")
    if not 0 <= value <= 1_000_000 or value != value:
        raise InvalidInput(field, "must be between 0 (no limit) and 1000000 per second")
    return float(value)
