"""Derived run ids are runfleet's, whatever client a producer uses.

A child is ``<parent>/child:<flow>#<n>`` and a later round ``<lineage>@<n>``; only workers
create them (and a producer's requeue of a failed round). The Queue API refused such ids,
but raw SQL with a producer's own credentials could admit one first, under its own scope:
the other tenant's parent then failed with ``ExecutionIdentityConflict`` when it reached
that child, and a handoff when it reached that round. The database refuses them now.
"""

from __future__ import annotations

from typing import LiteralString

import psycopg
import pytest

from runfleet.producer import AsyncQueue, EventCompleted
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from tests.security.conftest import Login, MakeLogin
from tests.support.polling import until

pytestmark = pytest.mark.usefixtures("role_worker")

ADMIT: LiteralString = (
    "INSERT INTO runfleet.runs (id, flow, queue, status, state, payload, lineage_id,"
    " round_ordinal, parent_run_id, created_at_ms, updated_at_ms)"
    " VALUES (%s, 'sec.leaf', 'default', 'pending', '{\"scopes\": [\"s2\"]}',"
    ' \'{"args": [0], "kwargs": {}}\', %s, %s,'
    " %s, runfleet.now_ms(), runfleet.now_ms())"
)

SQUATS: list[tuple[str, str, int, str | None]] = [
    # (id, lineage_id, round_ordinal, previous round): every shape a squatter could try
    ("victim/child:sec.leaf#1", "victim/child:sec.leaf#1", 0, None),  # the parent's child
    ("victim/spawn:sec.leaf#1", "victim/spawn:sec.leaf#1", 0, None),
    ("x/child:y", "x/child:y", 0, None),
    ("victim@1", "victim@1", 0, None),  # the lineage's next round, as a first round
    ("victim@1", "victim", 1, "victim"),  # ... as the round itself (victim has not failed)
    ("sneaky", "victim", 1, None),  # (lineage, round) taken under another id
    ("sneaky", "victim", 0, None),
    ("sneaky@7", "sneaky", 7, None),  # a later round of its own lineage, out of nowhere
    ("sneaky", "sneaky", -1, None),
]


async def _raw(who: Login, params: tuple[str, str, int, str | None]) -> None:
    async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
        await conn.execute(ADMIT, params)


async def test_a_producer_cannot_admit_a_derived_id_with_raw_sql(login: MakeLogin) -> None:
    owner = await login(GroupRole.PRODUCER, "s1")
    squatter = await login(GroupRole.PRODUCER, "s2")
    for params in SQUATS:
        with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses"):
            await _raw(squatter, params)
            pytest.fail(f"a producer admitted {params}")
    async with AsyncQueue("default", settings=squatter.settings, scopes=["s2"]) as q:
        await _raw(squatter, ("plain", "plain", 0, None))  # an ordinary id: admitted
        assert await q.run("plain").result(timeout=20) == 0

    # The parent whose child id was the first target reaches its child and completes.
    async with AsyncQueue("default", settings=owner.settings, scopes=["s1"]) as q:
        victim = await q.enqueue("sec.full", "v", run_id="victim")

        async def waiting() -> bool:
            row = await q.store.runs.get(victim.id)
            return bool(row and row.waiting and row.waiting.reason == "event")

        await until(waiting, 20, "the victim to reach its wait, past its child")
        assert isinstance(await q.complete(victim.id, "go", "ok"), EventCompleted)
        assert await victim.result(timeout=20) == {"upper": "V", "kid": 42, "answer": "ok"}
        child = await q.run("victim/child:sec.leaf#1").fetch()
        assert child.status is RunStatus.COMPLETED and child.scopes == ("s1",)


async def test_a_producers_requeue_of_a_failed_round_is_still_admitted(login: MakeLogin) -> None:
    """The one later round a producer writes (rq's requeue, ``runfleet retry``) passes the
    database's rule; the same shape for a round that did not fail does not."""
    me = await login(GroupRole.PRODUCER, "s1")
    other = await login(GroupRole.PRODUCER, "s2")
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        failed = await q.enqueue("sec.fails", "no", run_id="flaky")

        async def settled() -> bool:
            return (await q.run(failed.id).fetch()).status is RunStatus.FAILED

        await until(settled, 20, "the run to fail")
        again = await q.requeue(failed.id)
        assert again.id == "flaky@1"
    # Another tenant cannot write that lineage's next round, even naming the failed one.
    with pytest.raises(psycopg.errors.CheckViolation, match="requeue of a failed round"):
        await _raw(other, ("flaky@2", "flaky", 2, "flaky"))
