"""Flows the tracing tests run, and (in a worker process) the span file they export to.

A worker process started with ``RUNFLEET_TEST_SPANS=<path>`` imports this module through
``--flows`` and exports every ended span to that file as one JSON line (the SDK's
SimpleSpanProcessor: written as each span ends, so a SIGKILL loses only spans never
ended). In the test process the tests install the SDK's in-memory exporter instead.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from typing import Any

from runfleet.worker import Context, Retry, flow


def _install_file_exporter(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class FileExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            lines = []
            for s in spans:
                ctx = s.get_span_context()
                assert ctx is not None
                lines.append(
                    json.dumps(
                        {
                            "name": s.name,
                            "trace_id": f"{ctx.trace_id:032x}",
                            "span_id": f"{ctx.span_id:016x}",
                            "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                            "attributes": dict(s.attributes or {}),
                            "pid": os.getpid(),
                        }
                    )
                )
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, ("\n".join(lines) + "\n").encode())
            finally:
                os.close(fd)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


if os.environ.get("RUNFLEET_TEST_SPANS"):
    _install_file_exporter(os.environ["RUNFLEET_TEST_SPANS"])


FLAKY: dict[str, int] = {}


@flow(name="traced.leaf")
async def leaf(ctx: Context, n: int) -> int:
    async def double() -> int:
        return 2 * n

    return int(await ctx.step("double", double))


@flow(name="traced.three_steps")
async def three_steps(ctx: Context, tag: str) -> list[Any]:
    async def a() -> str:
        return "a"

    async def b() -> str:
        FLAKY[tag] = FLAKY.get(tag, 0) + 1
        if FLAKY[tag] == 1:
            raise RuntimeError("b fails once")
        return "b"

    async def c() -> str:
        return "c"

    out: list[Any] = [await ctx.step("a", a)]
    out.append(await ctx.step("b", b, retry=Retry(attempts=3, backoff=0.01)))
    out.append(await ctx.child(leaf, 21))
    out.append(await ctx.step("c", c))
    return out


@flow(name="traced.slow_second")
async def slow_second(ctx: Context, ledger: str) -> str:
    async def a() -> str:
        return "a"

    async def slow() -> int:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.write(fd, b"slow\n")
        os.close(fd)
        first = os.stat(ledger).st_size == len(b"slow\n")
        if first:
            await asyncio.sleep(60)  # killed in here
        return os.getpid()

    await ctx.step("a", a)
    await ctx.step("slow", slow)
    return "done"
