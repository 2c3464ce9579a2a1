"""Class-bound flows (``worker.authoring.instances``): one flow definition serves several configured
tenants; the run records its instance and every activation (a takeover after a SIGKILL
included) resolves it again, in real worker processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import tests.lifecycle.tenants_all as tenants
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.errors import ExecutionIdentityConflict, InvalidInput
from runfleet.store.types import RunStatus
from runfleet.worker import FlowInstance, flow
from runfleet.worker.authoring.flows import registered
from runfleet.worker.process import Worker
from runfleet.worker.resolver import runnable
from tests.fleet.procs import Spawn, records, running_on
from tests.lifecycle.tenant_flows import Tenant
from tests.ops.conftest import Cli
from tests.support.polling import until

ALL, ACME_ONLY = "tests.lifecycle.tenants_all", "tests.lifecycle.tenants_acme"


def _lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


async def _ledger(path: Path) -> list[str]:
    """What the steps did, in order (the ledger without its pid column)."""
    return [line.split(" ", 1)[1] for line in await asyncio.to_thread(_lines, path)]


async def test_one_flow_serves_each_instance_with_its_own_configuration(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path, cli: Cli
) -> None:
    ledger = str(tmp_path / "ledger")
    a = await queue.enqueue(tenants.ACME.welcome, ledger, "ann", 0)
    g = await queue.enqueue(tenants.GLOBEX.welcome, ledger, "gus", 0)
    got_a, got_g = await a.result(timeout=30), await g.result(timeout=30)
    assert (got_a["text"], got_a["loud"]) == ("hello, ann", "HELLO, ANN [acme]")
    assert (got_g["text"], got_g["loud"]) == ("bonjour, gus", "BONJOUR, GUS [globex]")
    for run, name in ((a, "acme"), (g, "globex")):
        row = await store.runs.get(run.id)
        assert row is not None and row.flow == "lifecycle.tenant.welcome"
        assert row.state["flow_instance"] == name
        # the child (a sync flow of the same class) was admitted for the parent's instance
        (edge,) = await store.dag.children(run.id)
        child = await store.runs.get(edge.child_id)
        assert child is not None and child.state["flow_instance"] == name
    assert "instance: admitted for instance 'acme'" in (await cli("explain", a.id)).stdout
    # One definition: one registered flow per method, whatever the number of instances.
    assert registered()["lifecycle.tenant.welcome"].owner is Tenant
    assert "lifecycle.tenant.welcome" not in runnable()  # never a priority look-ahead


async def test_a_class_level_flow_names_no_instance_and_is_refused(queue: AsyncQueue) -> None:
    with pytest.raises(InvalidInput, match="enqueue it from an instance"):
        await queue.enqueue(Tenant.welcome, "x", "y", 0)
    # A schedule names no instance to run on: the class statement is refused (Python
    # before 3.12 wraps what __set_name__ raises in a RuntimeError).
    with pytest.raises(Exception) as caught:

        class Scheduled(FlowInstance):
            @flow(name="lifecycle.tenant.scheduled", schedule="* * * * *")
            async def tick(*args: object) -> None: ...

    refused = caught.value if isinstance(caught.value, InvalidInput) else caught.value.__cause__
    assert isinstance(refused, InvalidInput) and "a schedule names no instance" in str(refused)


async def test_a_run_id_reused_with_another_instance_is_a_conflict(
    queue: AsyncQueue, store: Store
) -> None:
    """The instance decides which configured code runs: re-using a run id with another
    instance is another run (``ExecutionIdentityConflict(field="instance")``), not a join
    of the first instance's run; the same instance joins."""
    first = await queue.enqueue(tenants.ACME.welcome, "/dev/null", "ann", 0, run_id="inst-1")
    again = await queue.enqueue(tenants.ACME.welcome, "/dev/null", "ann", 0, run_id="inst-1")
    assert again.id == first.id
    with pytest.raises(ExecutionIdentityConflict) as caught:
        await queue.enqueue(tenants.GLOBEX.welcome, "/dev/null", "ann", 0, run_id="inst-1")
    assert caught.value.field == "instance"
    row = await store.runs.get("inst-1")
    assert row is not None and row.state["flow_instance"] == "acme"


@pytest.mark.chaos
async def test_a_worker_resolves_the_instance_after_a_takeover(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path, cli: Cli
) -> None:
    ledger = tmp_path / "ledger"
    a = spawn(flows=ACME_ONLY)
    await a.wait_started()
    other = await queue.enqueue(tenants.GLOBEX.welcome, str(ledger), "gus", 0)
    run = await queue.enqueue(tenants.ACME.welcome, str(ledger), "ann", 6000)
    await until(lambda: running_on(store, run.id, a.pid), 30, "acme's run on A")
    await until(
        lambda: _ledger(ledger), 30, "the slow step on A", accept=lambda x: "slow acme" in x
    )
    # A has no 'globex': it never claimed that run (it stays pending for a worker that has).
    assert "run.instance_unknown" in a.log()
    row = await store.runs.get(other.id)
    assert row is not None and row.status is RunStatus.PENDING and row.epoch == 0
    text = (await cli("explain", other.id)).stdout
    assert "no live worker has instance 'globex' — it waits for one (live: " in text
    assert f"pid {a.pid} has 'acme')" in text
    a.signal(signal.SIGKILL)
    await a.wait_exit()
    b = spawn(flows=ALL)
    await b.wait_started()
    result = await run.result(timeout=60)
    assert result == {
        "text": "hello, ann",
        "pid": b.pid,
        "loud": "HELLO, ANN [acme]",
        "instance": "acme",
    }
    assert (await other.result(timeout=60))["text"] == "bonjour, gus"
    assert len(await records(store, run.id, "stolen-and-activated")) == 1
    done = await _ledger(ledger)
    # acme's greet ran once (on A: B replayed its record); its slow step twice (A was
    # killed in it); globex's steps ran once, on B.
    assert sorted(done) == ["greet acme", "greet globex", "slow acme", "slow acme", "slow globex"]


async def test_the_registry_shows_the_signature_a_caller_passes(
    worker: Worker, store: Store
) -> None:
    found = await store.flows.get("lifecycle.tenant.welcome")
    assert found is not None and found.signature is not None
    assert found.signature.startswith("(ctx: ")  # no self: the worker supplies the instance
