"""The flows benchmark's work with OpenTelemetry's SDK installed (``--flows`` of the
tracing row): every span is recorded, batched and handed to an exporter that drops it,
so the row measures what tracing costs a worker, not what a collector costs."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from runfleet.ops.bench.three_steps import QUEUE, sleep_once, three_steps


class Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(Dropped()))
trace.set_tracer_provider(_provider)

__all__ = ["QUEUE", "sleep_once", "three_steps"]
