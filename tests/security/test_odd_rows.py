"""Readers never die on one row, and Postgres caps depth as it caps size.

A payload that nests 3,000 arrays deep (6 KB) is within every size cap, and Python's
``json`` gives up past ~1,000 levels, so every reader of such a row (``runfleet runs``,
``show``, ``explain``, ``cancel``, the dashboard's ``/runs``) would die with a traceback
and the tenant could not delete the row. The database refuses such a value
from a producer (``runfleet refuses payload: nested deeper than 64 levels``), a row that
holds one anyway (written before the cap, or by a role it does not hold) is shown as
``<undecodable: ...>`` beside the rest, and a tenant cancels and deletes its own runs.
"""

from __future__ import annotations

import json
from typing import Any, LiteralString

import httpx
import psycopg
import pytest

from runfleet.ops.dashboard.app import create_app
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunRow, RunStatus
from tests.dashboard.conftest import BASE
from tests.ops.conftest import CliResult, cli_env, invoke
from tests.security.conftest import Login, MakeLogin
from tests.security.test_roles import waiting_for_event
from tests.support.polling import until

pytestmark = pytest.mark.usefixtures("role_worker")

DEEP = "[" * 3000 + "]" * 3000
ADMIT: LiteralString = (
    "INSERT INTO runfleet.runs (id, flow, queue, status, state, payload, lineage_id,"
    " created_at_ms, updated_at_ms) VALUES (%s, 'sec.leaf', 'nowhere', 'pending',"
    " %s::jsonb, %s::json, %s, runfleet.now_ms(), runfleet.now_ms())"
)
SCOPES: LiteralString = '{"scopes": ["s1"]}'
ANSWER: LiteralString = (
    "SELECT outcome FROM runfleet.answer(%s, %s, NULL, false, %s::json, NULL, %s, %s,"
    " 'raw-sql', %s)"
)


async def _raw(url: str, query: LiteralString, params: tuple[Any, ...] = ()) -> Any:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else cur.rowcount


async def test_a_producer_cannot_store_a_value_nested_past_the_cap(login: MakeLogin) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    deep_state = json.dumps({"scopes": ["s1"], "meta": json.loads("[" * 65 + "]" * 65)})
    cases = {
        "payload": (SCOPES, DEEP),
        "state": (deep_state, '{"args": [], "kwargs": {}}'),
    }
    for field, (state, payload) in cases.items():
        with pytest.raises(
            psycopg.errors.CheckViolation,
            match=f"runfleet refuses {field}: nested deeper than 64 levels",
        ):
            await _raw(me.url, ADMIT, (f"deep-{field}", state, payload, f"deep-{field}"))
            pytest.fail(f"a producer stored a {field} 3,000 levels deep")
    # 64 levels is within the cap, and the API's own admissions pass as before.
    ok = "[" * 64 + "]" * 64
    assert await _raw(me.url, ADMIT, ("deep-64", SCOPES, ok, "deep-64")) == 1
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.leaf", {"a": [[{"b": 1}]]})
        assert (await q.store.runs.get(run.id)) is not None
    with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses state"):
        await _raw(
            me.url,
            "UPDATE runfleet.runs SET state = state || %s::jsonb WHERE id = 'deep-64'",
            (json.dumps({"meta": json.loads("[" * 100 + "]" * 100)}),),
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses payload"):
        await _raw(
            me.url,
            "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,"
            " at_ms) VALUES ('deep-64', 'note', 'me', 1, %s::jsonb, 'd', 0)",
            (DEEP,),
        )
    # An answer (through runfleet.answer, the only way one lands) and a message: the values
    # a worker hands to a flow.
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        asking = await q.enqueue("sec.full", "x", run_id="asking")
        await waiting_for_event(q, asking.id)
    with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses value: nested"):
        await _raw(me.url, ANSWER, ("asking", "go", DEEP, None, 1000, 1))
    with pytest.raises(psycopg.errors.CheckViolation, match="runfleet refuses value: nested"):
        await _raw(
            me.url,
            "INSERT INTO runfleet.run_messages (run_id, topic, message_id, value, digest,"
            " sent_at_ms) VALUES ('asking', 't', 'm1', %s::json, 'd', runfleet.now_ms())",
            (DEEP,),
        )
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        assert await q.store.deferreds.deferred("asking", "go") is None
        assert await q.complete("asking", "go", [[["fine"]]])
        assert (await q.run("asking").result(timeout=20))["answer"] == [[["fine"]]]


async def _odd_row(database_url: str, me: Login) -> None:
    """The row as the probe left it: 3,000 levels deep, in the tenant's scope. Written by the
    schema's owner, as a row from before the cap would be (a producer cannot)."""
    await _raw(database_url, ADMIT, ("odd", SCOPES, DEEP, "odd"))
    await _raw(
        database_url,
        "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload, digest,"
        " at_ms) VALUES ('odd', 'created', 'old', 1, %s::jsonb, 'd', runfleet.now_ms())",
        (DEEP,),
    )
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        await q.enqueue("sec.leaf", 1, run_id="plain")


async def test_every_reader_renders_the_odd_row_and_goes_on(
    login: MakeLogin, database_url: str, settings: Settings
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    await _odd_row(database_url, me)
    admin = cli_env(settings)

    async def cli(*args: str) -> CliResult:
        return await invoke(admin, *args)

    listing = await cli("runs", "--json")
    assert listing.clean and listing.code == 0, (listing.stdout, listing.exception)
    ids = {r["id"] for r in json.loads(listing.stdout)["runs"]}
    assert {"odd", "plain"} <= ids
    table = await cli("runs")
    assert table.clean and table.code == 0 and "odd" in table.stdout and "plain" in table.stdout

    for args in (
        ("show", "odd"),
        ("show", "odd", "--json"),
        ("explain", "odd"),
        ("explain", "odd", "--json"),
        ("journal", "odd"),
        ("journal", "odd", "--json"),
        ("tree", "odd"),
        ("stuck",),
    ):
        out = await cli(*args)
        assert out.clean and out.code == 0, (args, out.stdout, out.stderr, out.exception)
        if args[0] in ("show", "journal"):
            assert "<undecodable: nested deeper than Python decodes" in out.stdout, out.stdout

    app = create_app(settings, allowed_hosts=("testserver",))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client,
    ):
        page = await client.get("/runs")
        assert page.status_code == 200 and "odd" in page.text and "plain" in page.text
        one = await client.get("/runs/odd")
        assert one.status_code == 200 and "run odd" in one.text  # the page shows no payload

    # The tenant's own login: sees it, cancels it, and deletes it once it is settled.
    mine = cli_env(me.settings)
    seen = await invoke(mine, "runs", "--json")
    assert seen.clean and seen.code == 0, (seen.stdout, seen.exception)
    cancelled = await invoke(mine, "cancel", "odd", "--scope", "s1", "--json")
    assert cancelled.clean and cancelled.code == 0, (cancelled.stdout, cancelled.exception)
    assert json.loads(cancelled.stdout)["outcome"] == "requested"


async def test_a_worker_fails_the_odd_run_and_its_tenant_deletes_it(
    login: MakeLogin, database_url: str
) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    other = await login(GroupRole.PRODUCER, "s2")
    # On the queue the worker serves: it fails the run rather than run it with a string for
    # its arguments, and goes on with the next.
    await _raw(database_url, ADMIT.replace("'nowhere'", "'default'"), ("odd", SCOPES, DEEP, "odd"))
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        after = await q.enqueue("sec.leaf", 1, run_id="after")
        assert await after.result(timeout=20) == 2
        row = await until(lambda: _settled(q, "odd"), 20, "the odd run to settle")
        assert row.status is RunStatus.FAILED, row
        assert "undecodable" in json.dumps(row.state.get("error"), default=str), row.state
    async with AsyncQueue("nowhere", settings=me.settings, scopes=["s1"]) as q:
        plain = await q.enqueue("sec.leaf", 1, run_id="plain")
    async with AsyncQueue("nowhere", settings=other.settings, scopes=["s2"]) as q:
        await q.enqueue("sec.leaf", 1, run_id="theirs")

    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        deleted = await q.delete_run("odd")
        assert deleted.run_ids == ("odd",)
        assert await q.store.runs.get("odd") is None
        with pytest.raises(InvalidInput, match="not settled"):
            await q.delete_run(plain.id)
    # Raw SQL with the tenant's login: no table's rows directly, and through the function
    # only settled runs it can see, all or nothing.
    for query in (
        "DELETE FROM runfleet.runs WHERE id = 'theirs'",
        "DELETE FROM runfleet.journal WHERE run_id = 'plain'",
        "DELETE FROM runfleet.attempts",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await _raw(me.url, query)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not delete these runs"):
        await _raw(me.url, "SELECT * FROM runfleet.delete_settled(ARRAY['theirs', 'plain'])")
    with pytest.raises(psycopg.errors.CheckViolation, match="run 'plain' is not settled"):
        await _raw(me.url, "SELECT * FROM runfleet.delete_settled(ARRAY['plain'])")
    # Cancelled by the tenant: closed by a worker's sweep, then deleted by the tenant.
    async with AsyncQueue("nowhere", settings=me.settings, scopes=["s1"]) as q:
        await q.cancel(plain.id)
        row = await until(lambda: _settled(q, plain.id), 20, "the cancelled run to settle")
        assert row.status is RunStatus.CANCELLED, row
        await q.delete_run(plain.id)
        assert await q.store.runs.get(plain.id) is None
    left = await _raw(database_url, "SELECT count(*) FROM runfleet.journal WHERE run_id = 'odd'")
    assert left[0][0] == 0
    theirs = await _raw(database_url, "SELECT count(*) FROM runfleet.runs WHERE id = 'theirs'")
    assert theirs[0][0] == 1


async def _settled(q: AsyncQueue, run_id: str) -> RunRow | None:
    row = await q.store.runs.get(run_id)
    return row if row is not None and row.status.terminal else None


async def test_the_api_refuses_a_deep_value_with_a_typed_error(login: MakeLogin) -> None:
    me = await login(GroupRole.PRODUCER, "s1")
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    async with AsyncQueue("default", settings=me.settings, scopes=["s1"]) as q:
        with pytest.raises(InvalidInput, match="nested deeper than 64 levels") as payload:
            await q.enqueue("sec.leaf", deep)
        assert payload.value.field == "payload"
        with pytest.raises(InvalidInput, match="nested deeper than 64 levels") as meta:
            await q.enqueue("sec.leaf", 1, meta={"deep": deep})
        assert meta.value.field in ("meta", "state")
