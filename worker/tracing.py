"""OpenTelemetry traces of runs: a span per activation, step, attempt, wait and child.

One trace per run. Its root is the producer's span when the producer had one (the W3C
carrier ``runtime.trace_context`` wrote into the run's state), else a remote parent whose
trace and span ids are derived from the run id: every activation of the run — the first,
a resume after a wait, a takeover by another process — is a child of it, so they form one
trace whichever processes executed them. A child run is admitted with the carrier of its
parent's ``runfleet.child`` span, so its activations hang below that span in the same trace.

Off by default (``Settings.otel``): then ``TRACING`` is None, nothing from OpenTelemetry is
imported, and each hook is one ``is None`` test. The worker turns it on at start
(``enable``), with the global tracer provider the application configured.

Span names: ``runfleet.activation`` (attributes run id, flow, queue, epoch, owner: a
takeover is the next epoch under another owner), ``runfleet.step`` (name, key),
``runfleet.attempt`` (number; an error status when it failed or timed out),
``runfleet.wait`` (reason, token: recorded when the run parks), ``runfleet.child``
(child id, flow, detached).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from runfleet.runtime.trace_context import TRACE_STATE_KEY

if TYPE_CHECKING:
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.trace import Span, Tracer

    from runfleet.store.types import Owner, RunRow

T = TypeVar("T")

TRACING: Tracing | None = None
"""The process's tracing, or None (off): every hook checks this first."""


class Tracing:
    """The worker's tracer and the rules for where each span hangs."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self.tracer = tracer or trace.get_tracer("runfleet")

    def run_parent(self, row: RunRow) -> OtelContext:
        """The context every activation of ``row`` starts its span in."""
        carrier = row.state.get(TRACE_STATE_KEY)
        if isinstance(carrier, dict) and isinstance(carrier.get("traceparent"), str):
            extracted = self._propagator.extract({k: str(v) for k, v in carrier.items()})
            if self._trace.get_current_span(extracted).get_span_context().is_valid:
                return extracted
        digest = hashlib.sha256(row.lineage_id.encode("utf-8", "surrogatepass")).digest()
        parent = self._trace.SpanContext(
            trace_id=int.from_bytes(digest[:16], "big") or 1,
            span_id=int.from_bytes(digest[16:24], "big") or 1,
            is_remote=True,
            trace_flags=self._trace.TraceFlags(self._trace.TraceFlags.SAMPLED),
        )
        return self._trace.set_span_in_context(self._trace.NonRecordingSpan(parent))

    def activation(self, row: RunRow, owner: Owner) -> Span:
        return self.tracer.start_span(
            "runfleet.activation",
            context=self.run_parent(row),
            attributes={
                "runfleet.run_id": row.id,
                "runfleet.flow": row.flow,
                "runfleet.queue": row.queue,
                "runfleet.epoch": row.epoch,
                "runfleet.owner": owner.key,
            },
        )

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A span under the current one (the body's activation, or an enclosing step)."""
        with self.tracer.start_as_current_span(
            name,
            attributes={f"runfleet.{k}": v for k, v in attributes.items() if v is not None},
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            yield span

    def instant(self, name: str, **attributes: Any) -> None:
        """A span that records a moment (a park: the wait goes on outside any process)."""
        self.tracer.start_span(
            name, attributes={f"runfleet.{k}": v for k, v in attributes.items() if v is not None}
        ).end()

    def carrier(self) -> dict[str, str]:
        """The current span's W3C context, for a child run's state."""
        out: dict[str, str] = {}
        self._propagator.inject(out)
        return out


def enable(tracer: Tracer | None = None) -> Tracing:
    """Turn tracing on for this process (``Settings.otel``); ImportError names the extra."""
    global TRACING
    try:
        TRACING = Tracing(tracer)
    except ImportError as exc:
        raise ImportError(
            "RUNFLEET_OTEL needs OpenTelemetry: pip install 'runfleet[otel]'"
        ) from exc
    return TRACING


def disable() -> None:
    global TRACING
    TRACING = None


def start_task(
    coro: Coroutine[Any, Any, T], row: RunRow, owner: Owner, *, name: str
) -> asyncio.Task[T]:
    """The body's task, inside an activation span when tracing is on (ended with it)."""
    tracing = TRACING
    if tracing is None:
        return asyncio.create_task(coro, name=name)
    span = tracing.activation(row, owner)
    with tracing._trace.use_span(span, end_on_exit=False):
        task = asyncio.create_task(coro, name=name)  # copies the context: the span is current

    def end(done: asyncio.Task[T]) -> None:
        from opentelemetry.trace import Status, StatusCode

        if done.cancelled():
            span.set_attribute("runfleet.outcome", "interrupted")
        elif (exc := done.exception()) is not None:
            span.set_attribute("runfleet.outcome", type(exc).__name__)
            if isinstance(exc, Exception):
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        else:
            span.set_attribute("runfleet.outcome", "returned")
        span.end()

    task.add_done_callback(end)
    return task


def bind(coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """``coro``, to run on the loop in the calling thread's trace context (a sync body's
    durable calls: ``worker.authoring.sync_context``); itself when tracing is off."""
    if TRACING is None:
        return coro
    from opentelemetry import context as otel_context

    captured = otel_context.get_current()

    async def bound() -> T:
        token = otel_context.attach(captured)
        try:
            return await coro
        finally:
            otel_context.detach(token)

    return bound()


def step_span(name: str, key: str) -> contextlib.AbstractContextManager[Any]:
    tracing = TRACING
    if tracing is None:
        return contextlib.nullcontext()
    return tracing.span("runfleet.step", step=name, key=key)


def attempt_span(key: str, attempt: int) -> contextlib.AbstractContextManager[Any]:
    tracing = TRACING
    if tracing is None:
        return contextlib.nullcontext()
    return tracing.span("runfleet.attempt", key=key, attempt=attempt)


def child_span(child_id: str, flow: str, detached: bool) -> contextlib.AbstractContextManager[Any]:
    tracing = TRACING
    if tracing is None:
        return contextlib.nullcontext()
    return tracing.span("runfleet.child", child_id=child_id, child_flow=flow, detached=detached)


def child_carrier() -> dict[str, str] | None:
    """A child's trace context: the carrier of the current (``runfleet.child``) span."""
    tracing = TRACING
    if tracing is None:
        return None
    return tracing.carrier()


def parked(reason: str, token: str | None, wake_at_ms: int | None) -> None:
    tracing = TRACING
    if tracing is not None:
        tracing.instant("runfleet.wait", reason=str(reason), token=token, wake_at_ms=wake_at_ms)
