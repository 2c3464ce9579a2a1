"""Per-test login roles, members of runfleet's group roles, over the test's own database.

Roles are cluster-wide: each test creates its login roles under unique names and drops
them afterwards, and never relies on one it did not create. The group roles themselves
(runfleet_worker, ...) come from migration 0005 and are not dropped.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import tests.security.flows  # noqa: F401 - registers the flows in-process workers run
from runfleet.store import roles
from runfleet.store.config import Settings
from runfleet.store.roles import GroupRole
from runfleet.worker.process import Worker
from tests.support.workers import running


@dataclass(frozen=True)
class Login:
    name: str
    url: str
    settings: Settings


MakeLogin = Callable[..., Awaitable[Login]]


@pytest.fixture
async def login(database_url: str, settings: Settings) -> AsyncIterator[MakeLogin]:
    """``await login(GroupRole.PRODUCER, "s1")``: a fresh login role in that group."""
    created: list[str] = []
    prefix = f"rft_{secrets.token_hex(4)}"

    async def make(group: GroupRole, *scopes: str) -> Login:
        name = f"{prefix}_{group.value.removeprefix('runfleet_')}_{len(created)}"
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        created.append(name)
        await roles.apply_privileges(database_url, {name: group})
        if scopes:
            await roles.grant(database_url, name, list(scopes))
        url = make_conninfo(database_url, user=name)
        return Login(name, url, settings.model_copy(update={"database_url": url}))

    await roles.apply_privileges(database_url)
    try:
        yield make
    finally:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            for name in created:
                await conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
async def role_worker(login: MakeLogin) -> AsyncIterator[Worker]:
    """An in-process worker connected as a runfleet_worker login role (no grants)."""
    me = await login(GroupRole.WORKER)
    w = Worker(me.settings, queues=["default"], concurrency=8)
    async with running(w):
        yield w
