"""No tenant chooses where a journal record sorts, or whose address it takes.

A producer could INSERT journal rows with a ``seq`` of its choice: rows just ahead of the
sequence made the next appends anywhere in the fleet (another tenant's ``enqueue``, a
worker's own records) fail with a raw unique violation. It could equally take a worker's
next journal addresses (the worker's source id is on the producer's own runs), directly or
through ``runfleet.answer``. Now ``seq`` is an identity no producer's INSERT may name, and
an address belongs to its writer (the authenticated role, filled in by the database).
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg
import pytest

from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.roles import GroupRole
from tests.security.conftest import Login, MakeLogin
from tests.security.test_roles import waiting_for_event

pytestmark = pytest.mark.usefixtures("role_worker")

WRONG_TIMES: tuple[LiteralString, ...] = ("0", "runfleet.now_ms() + 86400000")

OVERRIDES: tuple[tuple[LiteralString, type[psycopg.Error]], ...] = (
    ("", psycopg.errors.GeneratedAlways),
    (" OVERRIDING SYSTEM VALUE", psycopg.errors.InsufficientPrivilege),
)

AHEAD = 300
"""How many addresses (and seqs) ahead the forger takes: more than the test then uses."""


async def _one(who: Login, query: LiteralString, params: tuple[Any, ...] = ()) -> Any:
    async with await psycopg.AsyncConnection.connect(who.url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchone() if cur.description else None


async def test_a_producers_raw_journal_rows_cannot_stall_other_tenants(
    login: MakeLogin, store: Store
) -> None:
    forger = await login(GroupRole.PRODUCER, "s1")
    victim = await login(GroupRole.PRODUCER, "s2")
    async with AsyncQueue("default", settings=forger.settings, scopes=["s1"]) as q:
        mine = await q.enqueue("sec.leaf", 1, run_id="mine")
        assert await mine.result(timeout=20) == 2
        asking = await q.enqueue("sec.full", "x", run_id="asking")
        await waiting_for_event(q, asking.id)
    # What the forger can see of its own runs: the journal's seq so far, and the worker's
    # journal address space (its source id) with the last number it used.
    (top,) = await _one(forger, "SELECT max(seq) FROM runfleet.journal")
    worker_id, worker_seq = await _one(
        forger,
        "SELECT source_id, max(source_seq) FROM runfleet.journal"
        " WHERE kind = 'claimed-and-activated' GROUP BY source_id",
    )

    # 1. seq chosen just ahead of the sequence: an identity always generated, and with
    # OVERRIDING SYSTEM VALUE a column no producer may write.
    for overriding, refusal in OVERRIDES:
        with pytest.raises(refusal, match=r"seq|journal"):
            await _one(
                forger,
                "INSERT INTO runfleet.journal"
                " (seq, run_id, kind, source_id, source_seq, payload, digest, at_ms)"
                + overriding
                + " SELECT %s + g, 'mine', 'forged', 'forger', g, '{}', 'd', 0"
                " FROM generate_series(1, %s) AS g",
                (top, AHEAD),
            )
    # 2. The worker's next addresses, as a plain INSERT and through runfleet.answer: both
    # land (audit lines of the forger's own run), as the forger's, not the worker's.
    await _one(
        forger,
        "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,"
        " at_ms) SELECT 'mine', 'forged', %s, %s + g, '{}', 'd', 0"
        " FROM generate_series(1, %s) AS g",
        (worker_id, worker_seq, AHEAD),
    )
    answered = await _one(
        forger,
        "SELECT outcome FROM runfleet.answer('asking', 'go', NULL, false, '1', NULL, NULL,"
        " 1000, %s, %s)",
        (worker_id, worker_seq + AHEAD + 1),
    )
    assert answered == ("answered",)
    (writers,) = await _one(
        forger,
        "SELECT array_agg(DISTINCT writer::text) FROM runfleet.journal WHERE source_id = %s"
        " AND (kind = 'forged' OR source_seq = %s)",
        (worker_id, worker_seq + AHEAD + 1),
    )
    assert writers == [forger.name], writers

    # Another tenant's admissions and the worker's own records go on: every one of these
    # needs fresh seqs and the worker's next addresses.
    async with AsyncQueue("default", settings=victim.settings, scopes=["s2"]) as q:
        runs = [await q.enqueue("sec.leaf", n, run_id=f"victim-{n}") for n in range(5)]
        assert [await r.result(timeout=20) for r in runs] == [0, 2, 4, 6, 8]
    async with AsyncQueue("default", settings=forger.settings, scopes=["s1"]) as q:
        assert (await q.run("asking").result(timeout=20))["answer"] == 1
    kinds = {r.kind for r in await store.journal.records("victim-4")}
    assert {"created", "claimed-and-activated", "transitioned"} <= kinds, kinds


async def test_no_identity_or_ordering_column_of_any_table_is_a_producers(
    login: MakeLogin,
) -> None:
    """The columns a producer may write are the ones admitting, cancelling and answering
    write; an identity (seq, writer, owner, epoch, lease, claim, result) is not one, and
    the times an admission carries are the database's."""
    forger = await login(GroupRole.PRODUCER, "s1")
    refused: dict[str, LiteralString] = {
        "journal writer": "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq,"
        " payload, digest, at_ms, writer) VALUES ('x', 'k', 's', 1, '{}', 'd', 0,"
        " 'runfleet_worker')",
        "edge seq": "INSERT INTO runfleet.run_parents (child_id, parent_id, seq)"
        " VALUES ('a', 'b', 1)",
        "edge": "INSERT INTO runfleet.run_parents (child_id, parent_id) VALUES ('a', 'b')",
        "run epoch": "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
        " created_at_ms, updated_at_ms, epoch) VALUES ('e', 'f', 'default', 'pending',"
        " '{\"scopes\": [\"s1\"]}', 'e', runfleet.now_ms(), runfleet.now_ms(), 7)",
        "run owner": "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
        " created_at_ms, updated_at_ms, owner_host, owner_pid, owner_nonce, heartbeat_at_ms)"
        " VALUES ('o', 'f', 'default', 'running', '{\"scopes\": [\"s1\"]}', 'o',"
        " runfleet.now_ms(), runfleet.now_ms(), 'h', 1, 'n', 0)",
        "run result": "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
        " created_at_ms, updated_at_ms, result) VALUES ('r', 'f', 'default', 'completed',"
        " '{\"scopes\": [\"s1\"]}', 'r', runfleet.now_ms(), runfleet.now_ms(), '\"forged\"')",
    }
    for what, statement in refused.items():
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await _one(forger, statement)
            pytest.fail(f"a producer wrote the {what}")
    # A run sorted ahead of (or behind) everyone in the sweeps' and retention's order.
    for created in WRONG_TIMES:
        with pytest.raises(psycopg.errors.CheckViolation, match="database's time"):
            await _one(
                forger,
                "INSERT INTO runfleet.runs (id, flow, queue, status, state, lineage_id,"
                " created_at_ms, updated_at_ms) VALUES ('t', 'f', 'default', 'pending',"
                " '{\"scopes\": [\"s1\"]}', 't', " + created + ", runfleet.now_ms())",
            )
