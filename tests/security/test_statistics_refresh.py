"""runfleet.analyze_grown (0025) ANALYZEs as the tables' owner, for workers only.

ANALYZE needs a table's owner; a worker's login role owns nothing, so the refresh is a
SECURITY DEFINER function with a fixed search path and no input. A worker may call it
(and it analyzes); a producer or an operator may not, so no scoped role can make the
fleet's database work on its behalf.
"""

from __future__ import annotations

import psycopg
import pytest

from runfleet.store.queries import q
from runfleet.store.roles import GroupRole
from tests.security.conftest import MakeLogin
from tests.store.helpers import committed_rows_counted

FILL = """
INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id, round_ordinal,
                           created_at_ms, updated_at_ms)
SELECT 'old-' || g, 'f.x', 'q', 'completed', '{}'::jsonb, 'old-' || g, 0, 1, 1
  FROM generate_series(1, 3000) g
"""


async def test_a_worker_role_refreshes_the_statistics(database_url: str, login: MakeLogin) -> None:
    worker = await login(GroupRole.WORKER)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        await admin.execute(FILL)
    await committed_rows_counted(database_url, "runfleet.runs", 3000)
    async with await psycopg.AsyncConnection.connect(worker.url, autocommit=True) as conn:
        analyzed = await (await conn.execute(q("sweeps.analyze_grown"))).fetchall()
    assert "runs" in [row[0] for row in analyzed]


@pytest.mark.parametrize("group", [GroupRole.PRODUCER, GroupRole.OPERATOR])
async def test_a_scoped_role_may_not_call_the_refresh(login: MakeLogin, group: GroupRole) -> None:
    other = await login(group, "s1")
    async with await psycopg.AsyncConnection.connect(other.url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(q("sweeps.analyze_grown"))
