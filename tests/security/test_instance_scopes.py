"""A flow instance serves only the scopes it was declared for.

The documented pattern gives each tenant an instance of one class-bound flow (its own
connection string). A tenant's producer could enqueue ``other_tenant.method`` — or write a
row naming the other's instance with raw SQL — and a worker ran it on that instance: the
run completed with the other tenant's connection string. Now an instance is declared with
the run scopes allowed to use it; admission refuses any other (``InstanceNotAllowed``),
and a worker refuses a row naming it whatever wrote the row (``run.instance_refused``).
Two tenant logins made the way ``runfleet roles`` makes them, a real worker process.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import tests.security.instance_flows as tf
from runfleet.producer import AsyncQueue
from runfleet.store.errors import InstanceNotAllowed
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from runfleet.worker import FlowInstance
from tests.fleet.procs import Spawn
from tests.security.conftest import MakeLogin
from tests.support.polling import until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ledger() -> Iterator[str]:
    path = Path(tempfile.mkstemp(prefix="rf-instances-")[1])
    yield str(path)
    path.unlink(missing_ok=True)


def _lines(ledger: str) -> list[str]:
    return Path(ledger).read_text().splitlines()


def _used(ledger: str, run_id: str) -> list[str]:
    return [line.split()[2] for line in _lines(ledger) if line.split()[1] == run_id]


async def test_a_tenant_cannot_run_a_flow_on_another_tenants_instance(
    login: MakeLogin, spawn: Spawn, ledger: str
) -> None:
    acme = await login(GroupRole.PRODUCER, "acme")
    globex = await login(GroupRole.PRODUCER, "globex")
    worker = spawn(flows="tests.security.instance_flows")
    await worker.wait_started()

    # Each tenant on its own instance: runs as documented.
    async with AsyncQueue("default", settings=acme.settings, scopes=["acme"]) as q:
        own = await q.enqueue(tf.ACME.use, ledger)
        assert await own.result(timeout=30) == tf.ACME.dsn
    async with AsyncQueue("default", settings=globex.settings, scopes=["globex"]) as q:
        # The other tenant's instance, through the API: refused at admission, typed.
        with pytest.raises(InstanceNotAllowed) as refused:
            await q.enqueue(tf.ACME.use, ledger, run_id="through-the-api")
        assert refused.value.instance == "acme" and refused.value.field == "scopes"
        assert await q.store.runs.get("through-the-api") is None
        # An instance of its own making that claims the other's name: its admission passes
        # in its own process, and the worker's instance decides.
        forged = tf.Connection("acme", "postgres://whatever", scopes=["globex"])
        impostor = await q.enqueue(forged.use, ledger, run_id="impostor")
    # The same with raw SQL under the tenant's own login.
    async with await psycopg.AsyncConnection.connect(globex.url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO runfleet.runs (id, flow, queue, status, state, payload, lineage_id,"
            " created_at_ms, updated_at_ms) VALUES ('raw', 'sec.connection.use', 'default',"
            " 'pending', %s::jsonb, %s::json, 'raw', runfleet.now_ms(), runfleet.now_ms())",
            (
                json.dumps({"scopes": ["globex"], "flow_instance": "acme"}),
                json.dumps({"args": [ledger], "kwargs": {}}),
            ),
        )

    async def refused_both() -> bool:
        log = worker.log()
        return all(f"run.instance_refused run_id={r}" in log for r in ("raw", impostor.id))

    await until(refused_both, 30, f"the worker to refuse both rows:\n{worker.log()[-3000:]}")
    async with AsyncQueue("default", settings=globex.settings, scopes=["globex"]) as q:
        theirs = await q.enqueue(tf.GLOBEX.use, ledger)  # the worker is live and past them
        assert await theirs.result(timeout=30) == tf.GLOBEX.dsn
        for run_id in ("raw", impostor.id):
            row = await q.run(run_id).fetch()
            assert row.status is RunStatus.PENDING and row.owner is None, row
            assert _used(ledger, run_id) == [], _lines(ledger)
    assert _used(ledger, own.id) == ["acme"] and _used(ledger, theirs.id) == ["globex"]
    assert "Traceback" not in worker.log(), worker.log()[-3000:]


def test_an_instance_names_the_scopes_it_serves() -> None:
    with pytest.raises(TypeError):
        FlowInstance("nameless")  # type: ignore[call-arg]  # the test is that it is required
    with pytest.raises(ValueError, match="scopes"):
        tf.Connection("x", "dsn", scopes=[])
    with pytest.raises(ValueError, match="scopes"):
        FlowInstance("x", scopes="acme")  # a str is not a list of scopes
