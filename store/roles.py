"""Database roles and scope grants: who may see and change which runs, decided by Postgres.

Row-level security (migration 0005) lets a producer or operator role see a run only
when the scopes granted to it cover the run's. These operations manage the two things
those policies read: the group roles' privileges and membership (cluster and database
objects, so they run on their own connection with the caller's credentials, never
through a worker's pool) and the ``runfleet.grants`` table. Only the schema owner or a
superuser can apply privileges or write grants; anyone else gets ``RolesRefused``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row

import runfleet.store.validate as validate
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, RunfleetError
from runfleet.store.queries import q
from runfleet.store.transient import retrying


class GroupRole(StrEnum):
    """The four documented roles; a login role gets its powers by membership in one."""

    MIGRATOR = "runfleet_migrator"
    WORKER = "runfleet_worker"
    PRODUCER = "runfleet_producer"
    OPERATOR = "runfleet_operator"

    @classmethod
    def parse(cls, text: str) -> GroupRole:
        """``worker`` or ``runfleet_worker``; anything else is a caller error."""
        for role in cls:
            if text in (role.value, role.value.removeprefix("runfleet_")):
                return role
        names = ", ".join(r.value.removeprefix("runfleet_") for r in cls)
        raise RolesRefused(f"unknown group role {text!r} (one of: {names})")


WILDCARD = "*"
"""The scope that covers every run, including runs that record no scope at all."""


class RolesRefused(RunfleetError):
    """The database refused a role or grant operation; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class RoleStatus:
    role: str
    exists: bool
    can_login: bool
    bypass_rls: bool
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grant:
    role: str
    scope: str
    granted_at_ms: int


@dataclass(frozen=True, slots=True)
class Limits:
    """What the database holds producers to whatever client they use (``runfleet.limits``,
    migration 0013): the same numbers as the settings of that name."""

    max_payload_bytes: int
    max_answers_per_run: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.max_payload_bytes, settings.max_answers_per_run)


@dataclass(frozen=True, slots=True)
class Visibility:
    """What the scoped roles can see of the fleet as a whole, and the limits they meet."""

    statistics_hidden: bool
    """The catalog's row counters and sizes are hidden from producers and operators (a
    superuser applied the privileges); otherwise every role reads them."""
    limits: dict[str, int]


def privileges_sql() -> str:
    """What ``runfleet roles --apply`` executes (and ``--print`` shows)."""
    return q("roles.privileges")


def _refused(exc: psycopg.Error) -> RolesRefused:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        text += " (only the schema owner, runfleet_migrator, or a superuser may do this)"
    return RolesRefused(text)


async def _connect(url: str) -> psycopg.AsyncConnection[DictRow]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)


APPLY_GIVE_UP_S = 30.0
"""How long ``apply_privileges`` retries a deadlock or a lost connection."""


async def apply_privileges(
    url: str, members: dict[str, GroupRole] | None = None, limits: Limits | None = None
) -> None:
    """Grant each group role exactly its documented privileges, and add login members;
    with ``limits``, write them to ``runfleet.limits`` (``Limits.of(settings)``).

    All in one transaction: a half-applied privilege set is never visible. The first
    apply moves each table's owner, which locks it; against a live fleet that can lose
    a deadlock (Postgres rolls the whole transaction back), so a transient failure is
    retried: the transaction is idempotent.
    """

    async def apply() -> None:
        async with await _connect(url) as conn, conn.transaction():
            await conn.execute(privileges_sql().encode())
            if limits is not None:
                await conn.execute(
                    q("roles.limits"),
                    {
                        "names": ["max_payload_bytes", "max_answers_per_run"],
                        "values": [limits.max_payload_bytes, limits.max_answers_per_run],
                    },
                )
            for login, group in (members or {}).items():
                statement = sql.SQL(q("roles.member")).format(
                    group=sql.Identifier(group.value), member=sql.Identifier(login)
                )
                await conn.execute(statement)

    try:
        await retrying(apply, give_up_after=APPLY_GIVE_UP_S)
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedObject) as exc:
        raise _refused(exc) from exc


async def status(url: str) -> list[RoleStatus]:
    async with await _connect(url) as conn:
        cur = await conn.execute(q("roles.status"), {"roles": [r.value for r in GroupRole]})
        return [
            RoleStatus(
                role=str(row["role"]),
                exists=bool(row["exists"]),
                can_login=bool(row["can_login"]),
                bypass_rls=bool(row["bypass_rls"]),
                members=tuple(row["members"]),
            )
            for row in await cur.fetchall()
        ]


async def visibility(url: str) -> Visibility:
    """Whether the catalog's statistics are hidden from scoped roles; the limits in force."""
    async with await _connect(url) as conn:
        row = await (await conn.execute(q("roles.visibility"))).fetchone()
        assert row is not None
        return Visibility(
            statistics_hidden=bool(row["statistics_hidden"]),
            limits={str(k): int(v) for k, v in row["limits"].items()},
        )


def _scopes(scopes: list[str]) -> list[str]:
    """The store's own rule for a scope (``validate.identifier``), so every scope a run
    can record can be granted, and nothing else."""
    if not scopes:
        raise RolesRefused("name at least one scope")
    try:
        return sorted({validate.identifier("scope", s) for s in scopes})
    except InvalidInput as exc:
        raise RolesRefused(str(exc)) from None


async def _grant_op(url: str, name: str, role: str, scopes: list[str]) -> list[str]:
    params = {"role": role, "scopes": _scopes(scopes)}
    try:
        async with await _connect(url) as conn:
            cur = await conn.execute(q(name), params)
            changed = sorted(str(row["scope"]) for row in await cur.fetchall())
            if not changed and name == "roles.grant":
                cur = await conn.execute(q("roles.role_exists"), params)
                row = await cur.fetchone()
                if row is None or not row["exists"]:
                    raise RolesRefused(f"role {role!r} does not exist")
            return changed
    except psycopg.errors.InsufficientPrivilege as exc:
        raise _refused(exc) from exc


async def grant(url: str, role: str, scopes: list[str]) -> list[str]:
    """Grant ``role`` the scopes; effective for its next statement. Returns the new ones."""
    return await _grant_op(url, "roles.grant", role, scopes)


async def revoke(url: str, role: str, scopes: list[str]) -> list[str]:
    """Withdraw the scopes; effective for the role's next statement. Returns those removed."""
    return await _grant_op(url, "roles.revoke", role, scopes)


async def grants(url: str) -> list[Grant]:
    """Every grant the caller may see (the owner: all; a scoped role: its own)."""
    async with await _connect(url) as conn:
        cur = await conn.execute(q("roles.grants"))
        return [
            Grant(str(r["role"]), str(r["scope"]), int(r["granted_at_ms"]))
            for r in await cur.fetchall()
        ]
