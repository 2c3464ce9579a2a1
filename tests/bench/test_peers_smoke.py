"""The peer benchmarks run end to end on tiny inputs (figures are not checked here).

Performance is judged by running the benchmarks side by side with their peers, never by
timing tests; these only prove that ``python -m bench fleet|flows|producer`` still work,
so a broken benchmark is found by CI rather than by the next person to run it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from bench import dbos_side, procrastinate_side, scaling, shapes
from bench.__main__ import app
from bench.plan import FleetPlan
from bench.servers import Servers
from runfleet.ops.servers.resolve import Endpoints


def _bench(services: Endpoints, *args: str) -> dict[str, Any]:
    urls = ["--database-url", services.database_url, "--redis-url", services.redis_url]
    result = CliRunner().invoke(app, [*args, *urls, "--json"])
    assert result.exit_code == 0, result.output
    payload: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{") :])
    return payload


def _producer_keys(services: Endpoints) -> list[bytes]:
    """What the producer benchmark left on the Redis it was given (its prefixes' keys)."""
    client = redis.Redis.from_url(services.redis_url)
    try:
        return [
            key
            for kind in ("producer", "shapes", "rq", "celery")
            for key in client.scan_iter(match=f"rf-bench-{kind}-*", count=1000)
        ]
    finally:
        client.close()


TINY = Path(__file__).resolve().parents[2] / "bench" / "plans" / "tiny.toml"
"""The plan file the docs name for a run of every phase at its smallest."""

TARGETS = {"drain >= 3x rq SimpleWorker", "enqueue, one call each >= 0.5x rq",
           "enqueue_many >= 1x rq"}  # fmt: skip


@pytest.mark.timeout(300)
def test_fleet_bench_runs_every_phase(services: Endpoints) -> None:
    """One invocation, every phase: the added ones (process counts, fsync on the given
    server as found, history, wait(), soak) share the headline's enqueue and drain."""
    out = _bench(services, "fleet", "--plan", str(TINY))
    assert out["plan"] == json.loads(FleetPlan.read(TINY).model_dump_json())
    assert out["runfleet"]["drain"]["runs"] == 41  # two enqueue phases and one warm-up run
    assert out["rq"]["drain"]["runs"] == 40
    assert out["recovery"]["steals"] >= 1
    assert out["backlog_recovery"]["steals"] >= 1
    assert out["backlog_recovery"]["backlog"] == 40
    assert out["memory"]["in_flight"] >= 1
    assert [(r["workers"], r["runfleet"]["runs"], r["rq"]["runs"]) for r in out["scale"]] == [
        (1, 40, 40)
    ]
    [fsync] = out["fsync"]  # a server the user named: only reported, never reconfigured
    assert fsync["server_started_by_bench"] is False and fsync["fsync"] in ("on", "off")
    assert fsync["drain"]["runs"] == 40
    history = out["history"]
    assert history["settled_runs"] == 300 and history["journal_records"] == 900
    assert history["empty"]["runs"] == history["with_history"]["runs"] == 40
    results = out["results"]
    assert results["runs"] == 10
    assert results["runfleet_settled_result"]["samples"] == 5
    assert results["rq_settled_return_value"]["samples"] == 5
    assert [s["runs"] for s in out["soak"]["samples"]] == [0, 30]
    assert set(out["targets"]) >= TARGETS | {
        "drain, 1 process >= 3x rq SimpleWorker",
        "drain with 300 settled runs within 10% of a fresh database",
        "worker RSS flat over 30 runs (growth < 20 MB or < 10%)",
    }


async def test_fsync_rows_start_their_own_servers(services: Endpoints) -> None:
    """Without a server named by the user, the bench starts one server each way."""
    rows = await scaling.fsync_rows(
        Servers(services.database_url, services.redis_url), runs=10, workers=1, concurrency=4
    )
    assert [(r.target.fsync, r.target.synchronous_commit, r.target.owned) for r in rows] == [
        ("on", "on", True),
        ("off", "off", True),
    ]
    assert all(r.drain.runs == 10 for r in rows)


@pytest.mark.skipif(not dbos_side.available(), reason="DBOS (the bench extra) is not installed")
def test_flows_bench_against_dbos(services: Endpoints) -> None:
    out = _bench(
        services, "flows", "--flows", "20", "--sleep-runs", "5", "--dbos-polling", "0.05",
        "--skip-fsync",
    )  # fmt: skip
    assert out["runfleet"]["flows"] == out["dbos"]["polling_0.05s"]["flows"] == 20
    assert [s["runs"] for s in out["sleeps"]] == [5, 5]


def test_flows_bench_runfleet_alone(services: Endpoints) -> None:
    out = _bench(services, "flows", "--flows", "20", "--skip-dbos", "--skip-sleep")
    assert out["runfleet"]["flows"] == 20 and out["dbos"] == {}
    [fsync] = out["fsync"]  # the given server as found; DBOS skipped there too
    assert fsync["server_started_by_bench"] is False and fsync["runfleet"]["flows"] == 20
    assert fsync["dbos"] is None
    # The RUNFLEET_OTEL row: the same flows with every span recorded, in the same run.
    assert out["traced"]["flows"] == 20 and out["traced_over_untraced"] > 0


@pytest.mark.timeout(600)
@pytest.mark.skipif(not dbos_side.available(), reason="DBOS (the bench extra) is not installed")
def test_producer_bench_runs_every_phase(services: Endpoints) -> None:
    """One invocation: runfleet, rq and DBOS side by side, every target reported."""
    out = _bench(
        services, "producer", "--runs", "20", "--flows", "5", "--samples", "5",
        "--rounds", "1", "--threads", "2", "--tasks", "4",
    )  # fmt: skip
    assert out["runfleet"]["settled_result_samples"] == 5
    assert out["runfleet"]["idle_start_samples"] == out["rq"]["idle_start_samples"] == 5
    parts = out["idle_start_parts"]  # every idle start split at its wake's stream entry
    assert parts["to_wake_samples"] == parts["wake_to_claim_samples"] == 5
    assert parts["to_wake_p50_ms"] >= 0 and parts["wake_to_claim_p50_ms"] >= 0
    assert min(parts[f"{hop}_{when}_p50_ms"] for hop in ("commit", "xadd")
               for when in ("back_to_back", "after_gap")) > 0  # fmt: skip
    assert out["flows_loop"]["dbos_per_s"] > 0 and out["flows_loop"]["runfleet_per_s"] > 0
    assert all(out["ratios"][k] > 0 for k in ("single_enqueue", "enqueue_many"))
    assert set(out["targets"]) == {
        "single enqueue >= 1x rq",
        "single enqueue >= 0.6x rq (the floor)",
        "enqueue_many >= 1.5x rq",
        "loop of enqueue then wait(), no-op jobs >= 3x rq",
        "loop of enqueue then wait(), three-step flows >= 4x DBOS",
        "wait() of a settled run p50 <= 0.5 ms",
        "idle enqueue -> start p50 <= 3 ms",
        "idle enqueue -> start p99 <= 6 ms",
    }
    if procrastinate_side.available():  # its idle starts: its own deferred -> started events
        assert out["procrastinate"]["idle_start_samples"] == 5
    assert out["shapes"]["threads"] == 2 and out["shapes"]["tasks"] == 4
    assert set(out["shapes"]["shapes"]) == {"one_thread", "threads", "tasks"}
    assert _producer_keys(services) == []  # its streams are dropped with its database


@pytest.mark.timeout(300)
def test_producer_shapes_report_rate_and_percentiles_beside_the_peers(
    services: Endpoints,
) -> None:
    """``--only shapes``: one thread, threads sharing one Queue and asyncio tasks sharing
    one AsyncQueue, each enqueueing alone and enqueueing then waiting for the result; rq
    and Celery beside runfleet where their producers have the shape (sync ones only),
    procrastinate in every shape."""
    out = _bench(
        services, "producer", "--only", "shapes", "--runs", "24", "--threads", "3",
        "--tasks", "6", "--rounds", "2",
    )  # fmt: skip
    assert out["only"] == "shapes" and out["threads"] == 3 and out["tasks"] == 6
    peers = {"rq", "celery"} if shapes.celery_available() else {"rq"}
    durable = {"procrastinate"} if procrastinate_side.available() else set()
    for shape, systems in (
        ("one_thread", {"runfleet"} | peers | durable),
        ("threads", {"runfleet"} | peers | durable),
        ("tasks", {"runfleet"} | durable),
    ):
        for mode in ("enqueue", "round_trip"):
            figures = out["shapes"][shape][mode]
            assert set(figures) == systems, (shape, mode, figures)
            for system, figure in figures.items():
                assert len(figure["rounds_per_s"]) == 2, (shape, mode, system)
                assert figure["per_s"] > 0 and 0 < figure["p50_ms"] <= figure["p99_ms"], figure
    assert _producer_keys(services) == []


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not procrastinate_side.available(), reason="procrastinate (the bench extra) is not installed"
)
def test_producer_shapes_beside_procrastinate_at_their_smallest(services: Endpoints) -> None:
    """The procrastinate side end to end: its schema in a scratch database of its own, its
    worker processes, every shape in both modes (``defer``/``defer_async``, then its status
    polled). ``--skip-procrastinate`` leaves its column out, saying why."""
    out = _bench(
        services, "producer", "--only", "shapes", "--runs", "4", "--threads", "2",
        "--tasks", "2", "--rounds", "1", "--workers", "1", "--skip-celery",
    )  # fmt: skip
    assert out["skipped"] == {"celery": "left out (--skip-celery)"}
    for shape in ("one_thread", "threads", "tasks"):
        for mode in ("enqueue", "round_trip"):
            figure = out["shapes"][shape][mode]["procrastinate"]
            assert len(figure["rounds_per_s"]) == 1, (shape, mode)
            assert figure["per_s"] > 0 and 0 < figure["p50_ms"] <= figure["p99_ms"], figure
    left_out = _bench(
        services, "producer", "--only", "shapes", "--runs", "2", "--threads", "1",
        "--tasks", "1", "--rounds", "1", "--workers", "1", "--skip-celery",
        "--skip-procrastinate",
    )  # fmt: skip
    assert "procrastinate" not in left_out["shapes"]["tasks"]["enqueue"]
    assert left_out["skipped"]["procrastinate"] == "left out (--skip-procrastinate)"


@pytest.mark.timeout(300)
def test_producer_bench_runs_the_flows_loop_alone(services: Endpoints) -> None:
    """``--only flows``: the three-step flows loop and nothing else (no rq, no admission
    phases), every round measured."""
    out = _bench(
        services, "producer", "--only", "flows", "--flows", "5", "--rounds", "2",
        "--skip-dbos",
    )  # fmt: skip
    assert out["only"] == "flows" and out["flows"] == 5
    assert out["flows_loop"]["runfleet_per_s"] > 0 and out["flows_loop"]["dbos_per_s"] is None
    assert len(out["rounds_raw"]["runfleet.flows_loop"]) == 2
    assert "rq" not in out and out["targets"] == {}
    assert _producer_keys(services) == []


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["fleet", "--skip", "recovery,sleep"], "--skip"),
        (["backlog", "--depths", "10,x"], "--depths"),
        (["flows", "--skip-dbos", "--dbos-polling", "0.1,fast"], "--dbos-polling"),
    ],
)
def test_a_bad_list_option_is_refused_by_name_before_any_server(
    args: list[str], option: str
) -> None:
    """One parser for the comma-separated options: a bad value is that option's error
    (typer's exit 2), and no server is found or started for it."""
    result = CliRunner().invoke(app, [*args, "--database-url", "postgresql://nowhere:1/x"])
    assert result.exit_code == 2, result.output
    assert option in result.output
