"""``fleet``, ``cancel``, ``journal --follow`` and the metrics endpoint, with real workers."""

from __future__ import annotations

import json
import signal

import pytest

import tests.fleet.flows as flows
from runfleet.ops.models import CancelResult, FleetView, JournalEntry
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from tests.fleet.procs import Spawn, running_on
from tests.ops.conftest import Cli
from tests.ops.metrics import free_port, scrape, scrape_when_up, value
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def _fleet(cli: Cli) -> FleetView:
    raw = await cli("fleet", "--json")
    assert raw.code == 0 and raw.clean, raw
    return FleetView.model_validate_json(raw.stdout)


async def _pids(cli: Cli) -> set[int]:
    return {w.pid for w in (await _fleet(cli)).workers}


async def test_fleet_lists_exactly_the_live_processes(
    spawn: Spawn, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    assert await _pids(cli) == set()
    missing = await cli("fleet", "--check")
    assert missing.code == 1 and "no live worker" in missing.stderr

    a, b = spawn(), spawn()
    await a.wait_started()
    await b.wait_started()
    run = await queue.enqueue(flows.forever)
    owner = await until(lambda: running_on(store, run.id), 10, "the run to start")
    assert owner.owner is not None
    view = await _fleet(cli)
    assert {w.pid for w in view.workers} == {a.pid, b.pid}
    assert all(not w.lapsed and w.queues == ["default"] for w in view.workers)
    owned = {w.pid: w.runs_owned for w in view.workers}
    assert owned[owner.owner.pid] == 1 and sum(n or 0 for n in owned.values()) == 1
    text = await cli("fleet")
    assert str(a.pid) in text.stdout and str(b.pid) in text.stdout
    assert (await cli("fleet", "--check", "--host", a_host(view))).code == 0
    assert (await cli("fleet", "--check", "--host", "no-such-host")).code == 1

    cancelled = await cli("cancel", run.id, "--json")
    assert cancelled.code == 0, cancelled
    assert CancelResult.model_validate_json(cancelled.stdout).outcome == "requested"
    followed = await cli("journal", run.id, "--follow", "--json")  # ends when it settles
    assert followed.code == 0, followed
    entries = [JournalEntry.model_validate_json(line) for line in followed.stdout.splitlines()]
    # Evidence from other workers (a wake refused by the owner's fresh lease) may land
    # around the settlement; the owner's own last decision is the cancellation.
    evidence = {"steal-refused-owner-alive", "claim-lost", "activation-lost"}
    decisions = [e for e in entries if e.kind not in evidence]
    assert decisions[-1].kind == "interrupted"
    assert decisions[-1].sentence.startswith("cancelled by its owner")
    again = await cli("cancel", run.id, "--json")
    assert CancelResult.model_validate_json(again.stdout).outcome == "already-terminal"

    victim = a if owner.owner.pid != a.pid else b
    victim.signal(signal.SIGKILL)  # its key expires (TTL 3 x heartbeat): no clean exit
    survivor = b if victim is a else a
    await until(lambda: _only(cli, {survivor.pid}), 10, "the killed worker to leave the fleet")
    survivor.signal(signal.SIGTERM)
    assert await survivor.wait_exit() == 0
    assert await _pids(cli) == set()  # a clean stop removes its key at once


def a_host(view: FleetView) -> str:
    return view.workers[0].host


async def _only(cli: Cli, pids: set[int]) -> bool:
    return await _pids(cli) == pids


async def test_metrics_move_when_a_run_is_driven(spawn: Spawn, queue: AsyncQueue, cli: Cli) -> None:
    port = free_port()
    worker = spawn(extra_args=["--metrics-port", str(port)])
    await worker.wait_started()
    before = await scrape_when_up(port)
    assert value(before, "runfleet_runs_in_flight") == 0
    assert ("runfleet_stream_lag", frozenset({("queue", "default")})) in before

    run = await queue.enqueue(flows.sleepy, 20, "m")
    assert (await run.result(timeout=10))["tag"] == "m"
    # The producer hears of the settlement before the drive has left the run: wait for
    # the gauge to come down rather than race it.
    after = await until(
        lambda: scrape(port),
        10,
        "runfleet_runs_in_flight to come back to 0",
        accept=lambda scraped: value(scraped, "runfleet_runs_in_flight") == 0,
    )

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("runfleet_claim_outcomes_total", outcome="activated") == 1
    assert moved("runfleet_settlements_total", status="completed") == 1
    assert moved("runfleet_enqueue_to_start_seconds_count") == 1
    assert value(after, "runfleet_runs_in_flight") == 0
    swept = [k for k in after if k[0] == "runfleet_sweep_duration_seconds_count"]
    assert {dict(labels)["kind"] for _, labels in swept} >= {"stale_running", "due_clocks"}
    batches = [k for k in after if k[0] == "runfleet_sweep_batch_size_count"]
    assert batches, "sweep batch sizes are observed"

    # A failing run: the failed settlement counter moves, and the CLI shows the error.
    failing = await queue.enqueue(flows.boom, "kaput")
    await until(lambda: _settled(queue, failing.id), 10, "the failing run to settle")
    final = await scrape(port)
    assert value(final, "runfleet_settlements_total", status="failed") == 1
    shown = await cli("show", failing.id, "--json")
    assert json.loads(shown.stdout)["state"]["error"]["message"] == "kaput"


async def _settled(queue: AsyncQueue, run_id: str) -> bool:
    return (await queue.run(run_id).get_status()).terminal
