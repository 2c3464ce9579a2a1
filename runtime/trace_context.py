"""W3C trace context carried from a producer's current span into the runs it admits.

Only with ``Settings.otel`` (the ``otel`` extra): the producer's current span, if any, is
written into the run's state as a ``traceparent``/``tracestate`` carrier, and the worker
(``worker.tracing``) makes every activation of the run a child of it; children and later
rounds get their parent's span the same way. Off, nothing here is imported.
"""

from __future__ import annotations

TRACE_STATE_KEY = "trace"
"""Where a run's state keeps the carrier (``{"traceparent": …, "tracestate": …}``)."""


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C trace context as a carrier; None without a valid span."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier or None
