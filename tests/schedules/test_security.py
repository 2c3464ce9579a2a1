"""Schedules under the least-privilege roles: a worker role fires them; row-level
security shows a producer or operator only the schedules its scope grants cover."""

from __future__ import annotations

import asyncio

import psycopg

from runfleet.store import Store
from runfleet.store.roles import WILDCARD, GroupRole
from runfleet.store.schedules import Fired, Schedules, ScheduleSpec
from tests.schedules.helpers import every_second, tick_runs
from tests.security.conftest import MakeLogin


async def test_a_worker_role_registers_and_fires_schedules(
    login: MakeLogin, database_url: str
) -> None:
    me = await login(GroupRole.WORKER)
    store = await Store.open(me.settings)
    try:
        schedules = Schedules.of(store)
        assert await schedules.upsert(every_second("w")) is not None
        await asyncio.sleep(1.1)
        fired = await schedules.fire("w", grace_ms=2000)
        assert isinstance(fired, Fired) and fired.admitted
    finally:
        await store.close()
    assert len(await tick_runs(database_url, "w")) == len(fired.admitted)


async def test_row_level_security_scopes_schedules_like_runs(
    login: MakeLogin, database_url: str, store: Store
) -> None:
    schedules = Schedules.of(store)
    base = every_second("x")
    for name, scopes in (("s1", ("s1",)), ("s1s2", ("s1", "s2")), ("fleet", ())):
        spec = ScheduleSpec(name=name, flow=base.flow, cron=base.cron, scopes=scopes)
        assert await schedules.add(spec) is not None
    for granted, visible in (
        (("s1",), {"s1"}),
        (("s1", "s2"), {"s1", "s1s2"}),
        ((WILDCARD,), {"s1", "s1s2", "fleet"}),
        ((), set()),
    ):
        me = await login(GroupRole.OPERATOR, *granted)  # re-applies roles.sql's privileges
        # What roles.sql does not grant yet: reading; the policies decide which rows show.
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await c.execute("GRANT SELECT ON runfleet.schedules TO runfleet_operator")
        async with await psycopg.AsyncConnection.connect(me.url) as conn:
            cur = await conn.execute("SELECT name FROM runfleet.schedules")
            assert {row[0] for row in await cur.fetchall()} == visible, granted
