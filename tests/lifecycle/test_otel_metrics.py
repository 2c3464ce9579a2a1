"""The worker's metrics through OpenTelemetry (``worker.otel_metrics``), read with the
SDK's in-memory metric reader: the same values as Prometheus when on, nothing when off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry import metrics as otel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

import tests.lifecycle.traced_flows as traced
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.worker import metrics, otel_metrics
from runfleet.worker.process import Worker
from tests.fleet.procs import ROOT
from tests.support.workers import running

_READER = InMemoryMetricReader()


@pytest.fixture(scope="session")
def provider() -> MeterProvider:
    chosen = MeterProvider(metric_readers=[_READER])
    otel.set_meter_provider(chosen)  # the application's provider, as a --flows module sets it
    return chosen


@pytest.fixture
def reader(provider: MeterProvider) -> Iterator[InMemoryMetricReader]:
    yield _READER
    otel_metrics.disable()


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every data point collected now, by instrument name."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    if data is None:
        return out
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def _value(points: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    for point in points.get(name, []):
        if dict(point.attributes or {}) == labels:
            return float(point.value)
    return None


def _prometheus(metric: Any, sample: str, **labels: str) -> float:
    for family in metric.collect():
        for s in family.samples:
            if s.name == sample and s.labels == labels:
                return float(s.value)
    return 0.0


def test_each_kind_of_metric_reads_as_prometheus_has_it(
    reader: InMemoryMetricReader, provider: MeterProvider
) -> None:
    bridge = otel_metrics.enable(provider.get_meter("runfleet-test"))
    names = {b.instrument for b in bridge.instruments}
    # Every metric of the reference page, under its Prometheus name.
    assert {"runfleet_settlements", "runfleet_runs_in_flight", "runfleet_hostile_input"} <= names
    assert {
        "runfleet_sweep_duration_seconds_bucket",
        "runfleet_sweep_duration_seconds_sum",
    } <= names
    metrics.SETTLEMENTS.labels(status="completed").inc(3)
    metrics.RUNS_IN_FLIGHT.set(7)
    metrics.SWEEP_DURATION.labels(kind="otel-test").observe(0.003)
    metrics.SWEEP_DURATION.labels(kind="otel-test").observe(20)
    points = _points(reader)
    completed = _prometheus(metrics.SETTLEMENTS, "runfleet_settlements_total", status="completed")
    assert _value(points, "runfleet_settlements", status="completed") == completed >= 3
    assert _value(points, "runfleet_runs_in_flight") == 7
    kind = {"kind": "otel-test"}
    assert _value(points, "runfleet_sweep_duration_seconds_count", **kind) == 2
    assert _value(points, "runfleet_sweep_duration_seconds_sum", **kind) == pytest.approx(20.003)
    assert _value(points, "runfleet_sweep_duration_seconds_bucket", le="0.005", **kind) == 1
    assert _value(points, "runfleet_sweep_duration_seconds_bucket", le="+Inf", **kind) == 2
    (counter,) = [
        m
        for r in reader.get_metrics_data().resource_metrics  # type: ignore[union-attr]  # the SDK answers None before a first collection
        for s in r.scope_metrics
        for m in s.metrics
        if m.name == "runfleet_settlements"
    ]
    # a Sum: cumulative and monotonic, as the Prometheus counter is
    assert isinstance(counter.data, Sum) and counter.data.is_monotonic
    otel_metrics.disable()
    assert "runfleet_settlements" not in _points(reader)  # off: its callbacks say nothing


@pytest.fixture
async def otel_worker(settings: Settings, reader: InMemoryMetricReader) -> AsyncIterator[Worker]:
    w = Worker(settings.model_copy(update={"otel": True}), queues=["default"], concurrency=4)
    async with running(w):
        yield w


async def test_a_worker_with_otel_on_exports_its_metrics(
    otel_worker: Worker, queue: AsyncQueue, reader: InMemoryMetricReader
) -> None:
    assert otel_metrics.BRIDGE is not None and otel_metrics.BRIDGE.meter is not None
    run = await queue.enqueue(traced.three_steps, "metrics")
    assert await run.result(timeout=30) == ["a", "b", 42, "c"]
    points = _points(reader)
    completed = _prometheus(metrics.SETTLEMENTS, "runfleet_settlements_total", status="completed")
    assert completed >= 2  # the run and its child
    assert _value(points, "runfleet_settlements", status="completed") == completed
    started = _prometheus(metrics.ENQUEUE_TO_START, "runfleet_enqueue_to_start_seconds_count")
    assert _value(points, "runfleet_enqueue_to_start_seconds_count") == started >= 2
    activated = _prometheus(
        metrics.CLAIM_OUTCOMES, "runfleet_claim_outcomes_total", outcome="activated"
    )
    assert _value(points, "runfleet_claim_outcomes", outcome="activated") == activated


async def test_with_otel_off_nothing_is_exported_or_imported(
    worker: Worker, queue: AsyncQueue, reader: InMemoryMetricReader
) -> None:
    assert otel_metrics.BRIDGE is None
    run = await queue.enqueue(traced.three_steps, "off")
    await run.result(timeout=30)
    assert not any(name.startswith("runfleet_") for name in _points(reader))
    # runfleet needs nothing from OpenTelemetry unless RUNFLEET_OTEL is set: with the
    # package unimportable, a worker process and the CLI load (the redis client imports
    # the SDK on its own when it is installed, so absence from sys.modules proves nothing).
    probe = (
        "import sys; sys.modules['opentelemetry'] = None;"
        "import runfleet, runfleet.worker.process, runfleet.ops.cli.app;"
        "from runfleet.worker import otel_metrics, tracing;"
        "print(otel_metrics.BRIDGE, tracing.TRACING)"
    )
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "None None", out


def test_a_worker_enabled_before_the_provider_is_set_and_again_after_reports() -> None:
    """The order a process meets: a first worker enables before the application sets its
    provider (the API's proxy meter), a second enables after; the counter still reaches
    the provider's reader. Its own interpreter: the global provider can be set only once."""
    probe = (
        "from opentelemetry import metrics as otel\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from runfleet.worker import metrics, otel_metrics\n"
        "otel_metrics.enable(); otel_metrics.disable()\n"
        "reader = InMemoryMetricReader()\n"
        "otel.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "otel_metrics.enable()\n"
        "metrics.SETTLEMENTS.labels(status='completed').inc(5)\n"
        "points = [p.value for r in reader.get_metrics_data().resource_metrics\n"
        "          for s in r.scope_metrics for m in s.metrics\n"
        "          if m.name == 'runfleet_settlements' for p in m.data.data_points\n"
        "          if dict(p.attributes) == {'status': 'completed'}]\n"
        "print(points)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "[5.0]", out
