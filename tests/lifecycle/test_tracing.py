"""OpenTelemetry: the span tree of a run (the SDK's in-memory exporter in-process, a file
exporter in real worker processes for a takeover), W3C context from the producer's span
into the run and its child, and nothing at all when tracing is off."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tests.lifecycle.traced_flows as traced
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker import tracing
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, running_on
from tests.support.polling import until
from tests.support.workers import running

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="session")
def provider() -> TracerProvider:
    chosen = TracerProvider()
    chosen.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(chosen)
    return chosen


@pytest.fixture
def spans(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    tracing.disable()


@pytest.fixture
async def traced_worker(settings: Settings, spans: InMemorySpanExporter) -> AsyncIterator[Worker]:
    w = Worker(settings.model_copy(update={"otel": True}), queues=["default"], concurrency=8)
    async with running(w):
        yield w


def _by_id(spans: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans if s.context is not None}


def _parent(span: ReadableSpan) -> int:
    return span.parent.span_id if span.parent is not None else 0


def _attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(f"runfleet.{name}")


async def test_a_three_step_flow_with_a_child_and_a_retry_is_one_tree(
    traced_worker: Worker, settings: Settings, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("the-producer")
    async with AsyncQueue("default", settings=settings.model_copy(update={"otel": True})) as q:
        with tracer.start_as_current_span("checkout") as producer:
            run = await q.enqueue(traced.three_steps, "tree")
        assert await run.result(timeout=30) == ["a", "b", 42, "c"]
    await until(
        lambda: _names(spans),
        10,
        "the child's spans",
        accept=lambda n: n.count("runfleet.activation") >= 3,
    )
    finished = spans.get_finished_spans()
    trace_id = producer.get_span_context().trace_id
    assert {s.context.trace_id for s in finished if s.context} == {trace_id}
    ours = [s for s in finished if s.name.startswith("runfleet.")]
    activations = [s for s in ours if s.name == "runfleet.activation"]
    parent_runs = [a for a in activations if _attr(a, "run_id") == run.id]
    child_runs = [a for a in activations if _attr(a, "run_id") != run.id]
    # The parent ran, parked on its child, and ran again: two activations, both children
    # of the producer's span; the child's activation hangs below the parent's child span.
    assert len(parent_runs) == 2 and len(child_runs) == 1
    assert {_parent(a) for a in parent_runs} == {producer.get_span_context().span_id}
    by_id = _by_id(finished)
    (child_span,) = [s for s in ours if s.name == "runfleet.child"]
    assert _parent(child_runs[0]) == child_span.context.span_id
    assert _parent(child_span) in {a.context.span_id for a in parent_runs}
    steps = {_attr(s, "key"): s for s in ours if s.name == "runfleet.step"}
    assert set(steps) == {"step:a#1", "step:b#1", "step:c#1", "step:double#1"}
    attempts = [s for s in ours if s.name == "runfleet.attempt"]
    b_attempts = [a for a in attempts if _parent(a) == steps["step:b#1"].context.span_id]
    assert [_attr(a, "attempt") for a in b_attempts] == [1, 2]
    assert b_attempts[0].status.status_code.name == "ERROR"
    assert b_attempts[1].status.status_code.name == "UNSET"
    (wait,) = [s for s in ours if s.name == "runfleet.wait"]
    assert _attr(wait, "reason") == "child"
    for s in ours:
        if s.name in ("runfleet.step", "runfleet.wait", "runfleet.child"):
            assert by_id[_parent(s)].name == "runfleet.activation", s.name


async def test_without_a_producer_span_a_run_is_still_one_trace(
    traced_worker: Worker, queue: AsyncQueue, spans: InMemorySpanExporter
) -> None:
    run = await queue.enqueue(traced.three_steps, "alone")  # otel off in this producer
    await run.result(timeout=30)
    await until(
        lambda: _names(spans), 10, "spans", accept=lambda n: n.count("runfleet.activation") >= 3
    )
    finished = spans.get_finished_spans()
    assert len({s.context.trace_id for s in finished if s.context}) == 1


async def test_tracing_off_records_nothing(
    worker: Worker, queue: AsyncQueue, spans: InMemorySpanExporter
) -> None:
    assert tracing.TRACING is None
    run = await queue.enqueue(traced.three_steps, "off")
    assert await run.result(timeout=30) == ["a", "b", 42, "c"]
    assert spans.get_finished_spans() == ()


@pytest.mark.chaos
async def test_a_takeover_continues_the_runs_trace(
    spawn: Spawn, settings: Settings, store: Store, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    span_file, ledger = tmp_path / "spans", tmp_path / "ledger"
    env = {"otel": True, "test_spans": str(span_file)}
    a = spawn(flows="tests.lifecycle.traced_flows", **env)
    await a.wait_started()
    tracer = trace.get_tracer("the-producer")
    async with AsyncQueue("default", settings=settings.model_copy(update={"otel": True})) as q:
        with tracer.start_as_current_span("order") as producer:
            run = await q.enqueue(traced.slow_second, str(ledger))
        await until(lambda: running_on(store, run.id, a.pid), 20, "run on A")
        await until(lambda: _text(ledger), 20, "the slow step on A", accept=bool)
        a.signal(signal.SIGKILL)
        await a.wait_exit()
        b = spawn(flows="tests.lifecycle.traced_flows", **env)
        await b.wait_started()
        assert await run.result(timeout=60) == "done"
    await until(
        lambda: _spans(span_file),
        10,
        "B's spans",
        accept=lambda s: any(x["name"] == "runfleet.activation" and x["pid"] == b.pid for x in s),
    )
    exported = await _spans(span_file)
    trace_id = f"{producer.get_span_context().trace_id:032x}"
    assert {s["trace_id"] for s in exported} == {trace_id}
    on_a = [s for s in exported if s["pid"] == a.pid]
    on_b = [s for s in exported if s["pid"] == b.pid]
    # A's activation never ended (SIGKILL): only its finished step a (and its attempt).
    assert sorted(s["name"] for s in on_a) == ["runfleet.attempt", "runfleet.step"]
    (b_act,) = [s for s in on_b if s["name"] == "runfleet.activation"]
    assert b_act["parent_id"] == f"{producer.get_span_context().span_id:016x}"
    assert b_act["attributes"]["runfleet.epoch"] == 2
    slow = [s for s in on_b if s["name"] == "runfleet.step"]
    assert [s["attributes"]["runfleet.key"] for s in slow] == ["step:slow#1"]  # a replayed


async def _names(spans: InMemorySpanExporter) -> list[str]:
    return [s.name for s in spans.get_finished_spans()]


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _text(path: Path) -> str:
    return await asyncio.to_thread(_read, path)


async def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (await _text(path)).splitlines() if line]
