"""``runfleet explain`` after a real SIGKILL and takeover, and for a run nobody can start."""

from __future__ import annotations

import signal

import pytest

import tests.fleet.flows as flows
from runfleet.ops.models import Explanation
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from tests.fleet.procs import Spawn, running_on
from tests.ops.conftest import Cli
from tests.ops.metrics import free_port, scrape, scrape_when_up, value
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def test_explain_after_sigkill_names_the_evidence_and_the_previous_owner(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings, cli: Cli
) -> None:
    a = spawn()
    await a.wait_started()
    run = await queue.enqueue(flows.sleepy, 8000, "explain")  # outlasts B's start
    await until(lambda: running_on(store, run.id, a.pid), 10, "run to start on A")
    port = free_port()
    b = spawn(extra_args=["--metrics-port", str(port)])
    await b.wait_started()
    before = await scrape_when_up(port)
    a.signal(signal.SIGKILL)
    await until(lambda: running_on(store, run.id, b.pid), 15, "B to steal the run")

    text = await cli("explain", run.id)
    assert text.code == 0 and text.clean, text
    print(text.stdout)  # the sample in the report: `pytest -s` shows it
    host = settings.host_id
    assert f"stolen from {host} pid {a.pid} by {host} pid {b.pid}" in text.stdout
    assert "its pid is gone on the same host [same-host-pid-dead]" in text.stdout
    assert f"owner: {host} pid {b.pid}" in text.stdout
    assert "alive right now" in text.stdout
    assert f"took the run over from {host} pid {a.pid}" in text.stdout
    assert "next: it is executing on" in text.stdout

    raw = await cli("explain", run.id, "--json")
    assert raw.code == 0, raw
    explained = Explanation.model_validate_json(raw.stdout)
    assert explained.run.owner is not None and explained.run.owner.pid == b.pid
    assert explained.owner_probe is not None and explained.owner_probe.vouches
    assert explained.lease is not None and not explained.lease.stale
    assert not explained.next.needs_person
    (steal,) = [e for e in explained.journal if e.kind == Kind.STOLEN_AND_ACTIVATED]
    assert steal.payload["previous_owner"].split(":")[1] == str(a.pid)
    assert steal.payload["probe"] == "same-host-pid-dead"

    after = await scrape(port)
    evidence = {"evidence": "same-host-pid-dead"}
    assert value(after, "runfleet_steals_total", **evidence) == (
        value(before, "runfleet_steals_total", **evidence) + 1
    )
    assert value(after, "runfleet_claim_outcomes_total", outcome="stolen") >= 1


async def test_explain_pending_run_on_a_queue_nobody_reads_needs_a_person(
    spawn: Spawn, settings: Settings, cli: Cli
) -> None:
    worker = spawn()  # reads "default" only
    await worker.wait_started()
    async with AsyncQueue("nobody", settings=settings) as nobody:
        run = await nobody.enqueue(flows.sleepy, 10)
    raw = await cli("explain", run.id, "--json")
    assert raw.code == 0, raw
    explained = Explanation.model_validate_json(raw.stdout)
    assert explained.run.status.value == "pending"
    assert explained.next.needs_person
    assert "no live worker reads queue nobody" in explained.next.summary
    assert explained.lines[-1].startswith("needs a person: ")


async def test_explain_without_redis_still_answers_from_the_database(
    queue: AsyncQueue, cli: Cli
) -> None:
    run = await queue.enqueue(flows.sleepy, 10)
    text = await cli("explain", run.id, redis_url="redis://127.0.0.1:1/0")
    assert text.code == 0 and text.clean, text
    assert "liveness: unknown — Redis did not answer" in text.stdout
    assert f"run {run.id} (tests.sleepy on queue default) is pending" in text.stdout
