"""The policies themselves: same from migrations as from schema.sql, on every table that
holds run data, free for workers, and grants that take effect at the next statement."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql

from runfleet.producer import AsyncQueue, RunNotFound
from runfleet.store import roles
from runfleet.store.config import Settings
from runfleet.store.migrate import canonical_schema, migrate
from runfleet.store.roles import GroupRole
from tests.ops.conftest import cli_env, invoke
from tests.security.conftest import MakeLogin

UNUSED_REDIS = "redis://127.0.0.1:1/0"
"""The roles commands touch only Postgres; the CLI still wants both URLs set."""

NewDatabase = Callable[[], Awaitable[str]]

POLICIES: LiteralString = """
    SELECT tablename, policyname, permissive, roles::text[], cmd, qual, with_check
      FROM pg_policies WHERE schemaname = 'runfleet' ORDER BY 1, 2"""
RLS: LiteralString = """
    SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'runfleet' AND c.relkind = 'r' ORDER BY 1"""
FLEET_TABLES = {
    "flows",
    "sweep_cursors",
    "sweep_leases",
    "schema_migrations",
    "limits",
    "queues",
    "queue_changes",
    "wake_marks",
    "flow_keys",
}
"""Tables that hold no run's data: fleet bookkeeping, readable without scopes."""


async def _rows(url: str, query: LiteralString) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        return await (await conn.execute(query)).fetchall()


async def test_migrations_and_schema_sql_have_the_same_policies(
    new_empty_database: NewDatabase,
) -> None:
    migrated, canonical = await new_empty_database(), await new_empty_database()
    await migrate(migrated)
    async with await psycopg.AsyncConnection.connect(canonical, autocommit=True) as conn:
        await conn.execute(canonical_schema().encode())
    for query in (POLICIES, RLS):
        got, want = await _rows(migrated, query), await _rows(canonical, query)
        assert want and [row for row in got if row[0] != "schema_migrations"] == want
    # Every table that is not fleet bookkeeping has row-level security: a new table
    # holding run data cannot ship without deciding who sees it.
    unprotected = {name for name, rls, _ in await _rows(migrated, RLS) if not rls}
    assert unprotected <= FLEET_TABLES, unprotected


async def test_workers_pay_nothing_for_row_level_security(
    database_url: str, login: MakeLogin
) -> None:
    """The worker's policies are `true`, folded away: its plans equal the superuser's."""
    me = await login(GroupRole.WORKER)
    producer = await login(GroupRole.PRODUCER, "s1")
    queries: list[LiteralString] = [
        "EXPLAIN (COSTS OFF) SELECT * FROM runfleet.runs WHERE id = 'x' FOR UPDATE",
        "EXPLAIN (COSTS OFF) UPDATE runfleet.runs SET heartbeat_at_ms = 1"
        " WHERE id = ANY ('{a,b}') AND status = 'running'",
        "EXPLAIN (COSTS OFF) SELECT * FROM runfleet.journal WHERE run_id = 'x'",
        "EXPLAIN (COSTS OFF) SELECT * FROM runfleet.steps WHERE run_id = 'x' AND key = 'k'",
    ]
    for query in queries:
        plain = await _rows(database_url, query)
        assert await _rows(me.url, query) == plain
        if "UPDATE" in query:  # a lease column: not a producer's to write at all
            continue
        scoped = await _rows(producer.url, query)  # the test would catch a no-op policy
        assert scoped != plain and ("InitPlan" in str(scoped) or "SubPlan" in str(scoped))


async def test_grants_and_revokes_take_effect_at_the_next_statement(
    database_url: str, login: MakeLogin
) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    other = await login(GroupRole.PRODUCER, "s2")
    async with AsyncQueue(
        "default", settings=owner.settings, scopes=["s1"], late_binding=True
    ) as q:
        run_id = (await q.enqueue("sec.leaf", 1, run_id="shared")).id
    async with AsyncQueue(
        "default", settings=other.settings, scopes=["s1", "s2"], late_binding=True
    ) as q:
        with pytest.raises(RunNotFound):
            await q.run(run_id).fetch()
        assert await roles.grant(database_url, other.name, ["s1"]) == ["s1"]
        assert (await q.run(run_id).fetch()).id == run_id  # same pool, same connections
        assert await roles.revoke(database_url, other.name, ["s1"]) == ["s1"]
        with pytest.raises(RunNotFound):
            await q.run(run_id).fetch()


async def test_a_run_without_scopes_needs_the_wildcard(login: MakeLogin) -> None:
    scoped = await login(GroupRole.PRODUCER, "s1")
    fleet = await login(GroupRole.PRODUCER, roles.WILDCARD)
    async with AsyncQueue("default", settings=scoped.settings, late_binding=True) as q:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            await q.enqueue("sec.leaf", 1, run_id="unscoped")
    async with AsyncQueue("default", settings=fleet.settings, late_binding=True) as q:
        await q.enqueue("sec.leaf", 1, run_id="unscoped")
        await q.enqueue("sec.leaf", 1, run_id="any-scope")
    async with AsyncQueue(
        "default", settings=scoped.settings, scopes=["s1"], late_binding=True
    ) as q:
        with pytest.raises(RunNotFound):
            await q.run("unscoped").fetch()


async def test_only_the_owner_manages_grants_and_privileges(
    database_url: str, login: MakeLogin
) -> None:
    producer = await login(GroupRole.PRODUCER, "s1")
    env = cli_env(producer.settings)
    for argv in (("grant", producer.name, "*"), ("revoke", producer.name, "s1")):
        refused = await invoke(env, *argv)
        assert refused.clean and refused.code == 1, refused
        assert "permission denied for table grants" in refused.stderr
    refused = await invoke(env, "roles", "--apply")
    assert refused.clean and refused.code == 1, refused
    assert "permission denied" in refused.stderr and "only the schema owner" in refused.stderr
    assert [g.scope for g in await roles.grants(producer.url)] == ["s1"]
    # Its own grants only: another role's scope names are not shown to it.
    await login(GroupRole.PRODUCER, "other-tenant")
    assert {g.scope for g in await roles.grants(database_url)} == {"s1", "other-tenant"}
    assert [g.scope for g in await roles.grants(producer.url)] == ["s1"]
    shown = await invoke(env, "roles")
    assert shown.code == 0 and "other-tenant" not in shown.stdout


ACLS: LiteralString = """
    SELECT c.relname, c.relowner::regrole::text, c.relacl::text[] FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = 'runfleet' AND c.relkind IN ('r', 'S') ORDER BY 1"""


async def test_roles_apply_is_idempotent_and_prints_what_it_runs(database_url: str) -> None:
    env = cli_env(Settings(database_url=database_url, redis_url=UNUSED_REDIS))
    first = await invoke(env, "roles", "--apply")
    assert first.code == 0, first
    after_first = await _rows(database_url, ACLS)
    assert (await invoke(env, "roles", "--apply")).code == 0
    assert await _rows(database_url, ACLS) == after_first
    assert {owner for _, owner, _ in after_first} == {GroupRole.MIGRATOR.value}
    printed = await invoke(env, "roles", "--print")
    assert printed.code == 0 and "GRANT SELECT, INSERT, UPDATE, DELETE" in printed.stdout
    shown = await invoke(env, "roles")
    for role in GroupRole:
        assert f"{role.value}" in shown.stdout
    bad = await invoke(env, "roles", "--apply", "--member", "someone=superuser")
    assert bad.clean and bad.code == 1 and "unknown group role 'superuser'" in bad.stderr


async def test_a_dropped_roles_grants_stop_applying_and_can_be_revoked_by_oid(
    database_url: str, login: MakeLogin
) -> None:
    gone = await login(GroupRole.PRODUCER, "s1")
    stays = await login(GroupRole.PRODUCER, "s1")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT %s::regrole::oid", (gone.name,))
        oid = str((await cur.fetchone() or [None])[0])
        await conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(gone.name)))
    # The dangling row harms no one (a later role of the same name inherits nothing),
    # shows as the OID, and the owner can remove it by that OID.
    assert [g.scope for g in await roles.grants(stays.url)] == ["s1"]
    assert {g.role for g in await roles.grants(database_url)} == {oid, stays.name}
    assert await roles.revoke(database_url, oid, ["s1"]) == ["s1"]
    assert {g.role for g in await roles.grants(database_url)} == {stays.name}


RUN_SCOPES: dict[str, str | None] = {
    "a": '["a"]',
    "ab": '["a", "b"]',
    "ac": '["a", "c"]',
    "empty": "[]",
    "missing": None,
    "scalar": '"a"',
    "nested": '[["a"]]',
}


@pytest.mark.parametrize(
    ("granted", "visible"),
    [
        (["a"], {"a"}),
        (["a", "b"], {"a", "ab"}),  # every scope of a run must be granted, not one
        (["c"], set()),
        ([roles.WILDCARD], set(RUN_SCOPES)),  # '*' covers everything, unscoped runs too
        ([], set()),
    ],
)
async def test_a_role_sees_exactly_the_runs_its_grants_cover(
    database_url: str, login: MakeLogin, granted: list[str], visible: set[str]
) -> None:
    me = await login(GroupRole.OPERATOR, *granted)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for run_id, scopes in RUN_SCOPES.items():
            await conn.execute(
                "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
                " created_at_ms, updated_at_ms) VALUES (%s, 'f', 'q', 'pending',"
                " CASE WHEN %s::jsonb IS NULL THEN '{}'::jsonb"
                " ELSE jsonb_build_object('scopes', %s::jsonb) END, %s, 0, 0)",
                (run_id, scopes, scopes, run_id),
            )
    async with await psycopg.AsyncConnection.connect(me.url) as conn:
        cur = await conn.execute("SELECT id FROM runfleet.runs")
        assert {row[0] for row in await cur.fetchall()} == visible


FORGERIES: list[LiteralString] = [
    "UPDATE runfleet.runs SET result = '42'",
    "UPDATE runfleet.runs SET owner_host = 'me', owner_nonce = 'n', epoch = epoch + 1",
    "UPDATE runfleet.runs SET flow = 'other.flow'",
    "UPDATE runfleet.steps SET output = '1', compensate = 'os:system'",
    "UPDATE runfleet.deferreds SET value = '1'",
    "DELETE FROM runfleet.journal",
    "DELETE FROM runfleet.runs",
    "INSERT INTO runfleet.clocks (run_id, name, deferred_name, due_at_ms)"
    " SELECT id, 'c', 'd', 0 FROM runfleet.runs",
    "INSERT INTO runfleet.flows (name, queue, registered_at_ms, last_seen_ms)"
    " VALUES ('x', 'q', 0, 0)",
]


async def test_a_producer_cannot_forge_results_tenure_or_records_of_its_own_runs(
    login: MakeLogin,
) -> None:
    """Column privileges: even within its scopes, a producer writes only what admitting,
    cancelling and answering write."""
    me = await login(GroupRole.PRODUCER, "s1")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"], late_binding=True) as q:
        await q.enqueue("sec.leaf", 1, run_id="mine")
    async with await psycopg.AsyncConnection.connect(me.url, autocommit=True) as conn:
        for statement in FORGERIES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement)
                pytest.fail(f"a producer ran: {statement}")


async def test_grant_names_roles_exactly_and_scopes_by_the_stores_rule(
    database_url: str, login: MakeLogin
) -> None:
    me = await login(GroupRole.OPERATOR)
    env = cli_env(Settings(database_url=database_url, redis_url=UNUSED_REDIS))
    for argv, message in (
        (("grant", "no such role", "s"), "role 'no such role' does not exist"),
        (("grant", me.name.upper(), "s"), f"role '{me.name.upper()}' does not exist"),
        (("grant", me.name, "x" * 256), "invalid scope: is 256 characters"),
        (("grant", me.name, "a\tb"), "invalid scope: must not contain control characters"),
    ):
        refused = await invoke(env, *argv)
        assert refused.clean and refused.code == 1 and message in refused.stderr, refused
    granted = await invoke(env, "grant", me.name, "s", "s", "t")
    assert granted.code == 0 and f"granted {me.name}: s, t" in granted.stdout
    again = await invoke(env, "grant", me.name, "s")
    assert again.code == 0 and "nothing new" in again.stdout
    revoked = await invoke(env, "revoke", me.name, "s", "u")
    assert revoked.code == 0 and f"revoked {me.name}: s" in revoked.stdout
    assert [g.scope for g in await roles.grants(me.url)] == ["t"]
