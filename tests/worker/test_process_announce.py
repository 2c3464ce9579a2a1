"""What a worker process tells operators and producers about itself, one part at a time:
its start line (``worker.started``, and ``worker.runs_nothing`` when it may run nothing),
the flow registry it writes at start, the stream-lag gauge it keeps, and where its
driver's freed slots and refused rates go. The process's flows, modules and import
prefixes are process-wide, so each test names its own through the names ``_announce``
and ``_register_flows`` read."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

import runfleet.worker.process as process
from runfleet.broker.codec import message_for
from runfleet.broker.streams import Lane, Streams
from runfleet.broker.wake_reasons import WakeReason
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner
from runfleet.worker import Context, FlowInstance
from runfleet.worker.authoring.flows import Flow
from runfleet.worker.process import QueueSlots, StreamLag, Worker
from tests.support.polling import until

OWNER = Owner("host-announce", 4242, "nonce-announce")
HINT = "pass --flows app.flows (or --allow-import app)"


async def place_order(ctx: Context, order_id: str, *, rush: bool = False) -> str:
    return order_id


class Shop(FlowInstance):
    async def restock(self, ctx: Context, sku: str, count: int = 1) -> int:
        return count


PLAIN = Flow(name="announce.place_order", fn=place_order, queue="orders")
BOUND = Flow(name="announce.shop.restock", fn=Shop.restock, queue="stock", owner=Shop)
OPAQUE = Flow(name="announce.opaque", fn=max)
"""A builtin without a text signature: ``inspect.signature`` cannot read it."""


def serving(
    monkeypatch: pytest.MonkeyPatch,
    flows: list[Flow],
    modules: Sequence[str] = (),
    prefixes: Sequence[str] = (),
) -> None:
    """This process's registered flows, ``--flows`` modules and ``--allow-import`` prefixes."""
    monkeypatch.setattr(process, "registered", lambda: {f.name: f for f in flows})
    monkeypatch.setattr(process, "flow_modules", lambda: list(modules))
    monkeypatch.setattr(process, "import_prefixes", lambda: list(prefixes))


def lines(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]


STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def extra(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a line carries besides the standard ones (its ``extra``)."""
    return {k: v for k, v in vars(record).items() if k not in STANDARD}


# ---- the start line ----------------------------------------------------------------


def test_the_start_line_names_everything_the_process_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.process")
    serving(monkeypatch, [PLAIN, BOUND, OPAQUE], ["app.flows", "app.more"], ["app", "lib"])
    worker = Worker(
        Settings(), queues=["high", "default", "high"], concurrency=3, owner=OWNER, burst=True
    )
    worker._announce()
    (line,) = lines(caplog, "worker.started")
    assert line.levelno == logging.INFO
    assert extra(line) == {
        "owner": "host-announce:4242:nonce-announce",
        "queues": ["high", "default"],
        "concurrency": 3,
        "burst": True,
        "flows": ["announce.opaque", "announce.place_order", "announce.shop.restock"],
        "modules": ["app.flows", "app.more"],
        "allow_import": ["app", "lib"],
    }
    assert lines(caplog, "worker.runs_nothing") == []


def test_a_process_that_may_run_nothing_says_so_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.process")
    serving(monkeypatch, [])
    Worker(Settings(), owner=OWNER)._announce()
    (started,) = lines(caplog, "worker.started")
    assert extra(started) == {
        "owner": OWNER.key,
        "queues": ["default"],
        "concurrency": 16,
        "burst": False,
        "flows": [],
        "modules": [],
        "allow_import": [],
    }
    (warning,) = lines(caplog, "worker.runs_nothing")
    assert warning.levelno == logging.WARNING
    assert extra(warning) == {"hint": HINT}


@pytest.mark.parametrize(
    ("flows", "modules", "prefixes"),
    [
        pytest.param([PLAIN], ["tests.worker.test_process_announce"], [], id="a flow"),
        pytest.param([], ["app.tasks"], [], id="a --flows module of plain functions"),
        pytest.param([], [], ["app"], id="an --allow-import prefix"),
    ],
)
def test_any_one_thing_it_may_run_is_enough_to_stay_quiet(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    flows: list[Flow],
    modules: list[str],
    prefixes: list[str],
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.process")
    serving(monkeypatch, flows, modules, prefixes)
    Worker(Settings(), owner=OWNER)._announce()
    assert len(lines(caplog, "worker.started")) == 1
    assert lines(caplog, "worker.runs_nothing") == []


# ---- the flow registry -------------------------------------------------------------


async def test_each_flow_is_registered_with_its_queue_and_the_signature_callers_use(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, store: Store
) -> None:
    serving(monkeypatch, [PLAIN, BOUND, OPAQUE])
    worker = Worker(settings, owner=OWNER)
    worker.store = store
    await worker._register_flows()
    plain = await store.flows.get(PLAIN.name)
    assert plain is not None
    assert (plain.queue, plain.signature) == (
        "orders",
        "(ctx: 'Context', order_id: 'str', *, rush: 'bool' = False) -> 'str'",
    )
    bound = await store.flows.get(BOUND.name)  # called on its instance: no ``self``
    assert bound is not None
    assert (bound.queue, bound.signature) == (
        "stock",
        "(ctx: 'Context', sku: 'str', count: 'int' = 1) -> 'int'",
    )
    opaque = await store.flows.get(OPAQUE.name)  # registered, its signature unknown
    assert opaque is not None
    assert (opaque.queue, opaque.signature) == ("default", None)


async def test_a_registration_that_fails_is_logged_and_the_rest_still_register(
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
    store: Store,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.process")
    serving(monkeypatch, [BOUND, PLAIN])
    real = store.flows.register

    async def register(name: str, queue: str, signature: str | None) -> None:
        if name == BOUND.name:
            raise psycopg.OperationalError("server closed the connection")
        await real(name, queue, signature)

    monkeypatch.setattr(store.flows, "register", register)
    worker = Worker(settings, owner=OWNER)
    worker.store = store
    await worker._register_flows()
    assert await store.flows.get(BOUND.name) is None
    assert await store.flows.get(PLAIN.name) is not None
    (line,) = lines(caplog, "flow.register_failed")
    assert line.levelno == logging.WARNING
    assert extra(line) == {
        "flow": BOUND.name,
        "error": "OperationalError('server closed the connection')",
    }


# ---- the stream-lag gauge ----------------------------------------------------------


def gauge(queue: str) -> float | None:
    return REGISTRY.get_sample_value("runfleet_stream_lag", {"queue": queue})


async def gauges(*queues: str) -> tuple[float | None, ...]:
    return tuple(gauge(q) for q in queues)


def lag_errors() -> float:
    value = REGISTRY.get_sample_value(
        "runfleet_infrastructure_errors_total", {"component": "stream-lag"}
    )
    return value or 0.0


@pytest.fixture
def fast_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "LAG_INTERVAL_S", 0.01)


@pytest.fixture
def streams(redis_client: Redis, redis_prefix: str) -> Streams:
    return Streams(redis_client, redis_prefix)


@pytest.fixture
def two_queues(redis_prefix: str) -> tuple[str, str]:
    return f"lag-a-{redis_prefix}", f"lag-b-{redis_prefix}"


async def publish(streams: Streams, queue: str, count: int, lane: Lane = Lane.NORMAL) -> None:
    for i in range(count):
        await streams.publish(queue, message_for(f"r{i}", "f.x", WakeReason.ENQUEUE), lane)


async def test_each_queue_s_lag_is_published_and_kept_current(
    fast_lag: None, streams: Streams, two_queues: tuple[str, str]
) -> None:
    a, b = two_queues
    await streams.ensure_groups([a, b])
    await publish(streams, a, 3)
    await publish(streams, b, 1)
    await publish(streams, b, 1, Lane.RECOVERY)  # both lanes count
    service = StreamLag(streams, [a, b])
    service.start()
    try:
        await until(lambda: gauges(a, b), what="both gauges", accept=lambda got: got == (3, 2))
        await publish(streams, a, 2)
        await until(lambda: gauges(a), what="a's new lag", accept=lambda got: got == (5,))
    finally:
        service.stop()
    assert await service.wait_stopped(5)


async def test_a_stop_ends_it_within_its_pause(
    streams: Streams, two_queues: tuple[str, str]
) -> None:
    a, _ = two_queues
    await publish(streams, a, 1)
    service = StreamLag(streams, [a])
    service.start()
    await until(lambda: gauges(a), what="a's lag", accept=lambda got: got == (1,))
    service.stop()  # in its 5 s pause now
    assert await service.wait_stopped(1)


class FlakyStreams:
    """Streams whose ``lag`` fails for one queue (Redis refusing it) and answers 7 for others."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.failures = 0
        self.failed_twice = asyncio.Event()

    async def lag(self, queue: str) -> int:
        if queue == self.broken:
            self.failures += 1
            if self.failures >= 2:
                self.failed_twice.set()
            raise ConnectionError("redis went away")
        return 7


async def test_a_lag_it_cannot_read_is_counted_logged_and_skipped(
    fast_lag: None, two_queues: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="runfleet.worker.process")
    broken, fine = two_queues
    fake = FlakyStreams(broken)
    before = lag_errors()
    service = StreamLag(fake, [broken, fine])  # type: ignore[arg-type]  # only ``lag`` is read
    service.start()
    try:
        await asyncio.wait_for(fake.failed_twice.wait(), 5)  # it goes on after a failure
    finally:
        service.stop()
    assert await service.wait_stopped(5)
    assert gauge(fine) == 7.0  # the queue after the broken one still got its pass
    assert lag_errors() - before == fake.failures
    failed = lines(caplog, "stream.lag_failed")
    assert len(failed) == fake.failures
    for line in failed:
        assert line.levelno == logging.DEBUG
        assert extra(line) == {"queue": broken, "error": "ConnectionError('redis went away')"}


# ---- the driver's slots ------------------------------------------------------------


class Recorder:
    """The outbox's ``slot_freed`` and the rate pump's ``due``, as calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def slot_freed(self, queue: str) -> None:
        self.calls.append(("slot_freed", queue))

    def due(self, queue: str, after_ms: int) -> None:
        self.calls.append(("due", queue, after_ms))


def test_a_freed_slot_goes_to_the_outbox_and_a_refused_rate_to_the_pump() -> None:
    outbox, pump = Recorder(), Recorder()
    slots = QueueSlots(outbox, pump)  # type: ignore[arg-type]  # the two methods it calls
    slots.slot_freed("limited")
    slots.rate_due("rated", 250)
    assert outbox.calls == [("slot_freed", "limited")]
    assert pump.calls == [("due", "rated", 250)]
