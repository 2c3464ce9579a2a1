"""``/healthz`` and ``/readyz`` on the metrics port (worker/health.py).

Unit tests drive ``Health`` with a fake clock; the real-process tests start
``runfleet worker --metrics-port`` and probe it over HTTP while its database link is
frozen (readiness must drop, liveness must not), while a flow blocks its event loop
(liveness must drop although the HTTP thread still answers), and while it drains
after SIGTERM (not ready, still alive, exits cleanly).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import LOOP_STALL_FLOOR, Settings
from runfleet.worker.health import LIVENESS_PATH, READINESS_PATH, Health
from tests.fleet.procs import WorkerProc, running_on
from tests.fleet.tcpproxy import FreezableProxy
from tests.ops.metrics import free_port
from tests.support.polling import until

# ---- unit: the verdicts ------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_once_the_loop_stops_beating_and_recovers_on_a_beat() -> None:
    clock = FakeClock()
    health = Health(stall_after=3.0, beat_every=0.5, clock=clock)
    assert health.liveness().ok
    clock.now += 2.9
    assert health.liveness().ok
    clock.now += 0.2
    verdict = health.liveness()
    assert not verdict.ok and verdict.status.startswith("503")
    assert verdict.detail["loop_age_s"] == pytest.approx(3.1)
    health.beat()
    assert health.liveness().ok


def test_readiness_needs_the_check_no_stall_and_no_stop() -> None:
    clock = FakeClock()
    health = Health(stall_after=3.0, beat_every=0.5, clock=clock)
    assert health.readiness().detail["reason"] == "not-started-or-lease-unconfirmed"
    lease_open = {"value": True}
    health.ready_when(lambda: lease_open["value"])
    assert health.readiness().ok and health.readiness().status == "200 OK"
    lease_open["value"] = False  # e.g. the lease lapsed
    assert not health.readiness().ok
    lease_open["value"] = True
    clock.now += 5
    assert health.readiness().detail["reason"] == "event-loop-stalled"
    health.beat()
    assert health.readiness().ok
    health.stopping()
    assert health.readiness().detail == {"reason": "stopping"}
    assert health.liveness().ok, "a draining worker is alive: no restart mid-drain"


def test_a_raising_check_is_an_unready_answer_not_an_error() -> None:
    health = Health(stall_after=3.0, beat_every=0.5)

    def broken() -> bool:
        raise AttributeError("lease")

    health.ready_when(broken)
    verdict = health.readiness()
    assert not verdict.ok and verdict.detail["reason"] == "check-failed"


def test_thresholds_follow_the_heartbeat_interval_with_a_floor() -> None:
    assert Health.for_settings(Settings(heartbeat_interval=1.0)).stall_after == 3.0
    assert Health.for_settings(Settings(heartbeat_interval=1.0)).beat_every == 0.5
    fast = Health.for_settings(Settings(heartbeat_interval=0.2))
    assert fast.stall_after == LOOP_STALL_FLOOR
    with pytest.raises(ValueError):
        Health(stall_after=0.5, beat_every=0.5)


async def test_beats_come_from_the_loop_so_a_blocked_loop_is_seen() -> None:
    health = Health(stall_after=0.3, beat_every=0.05)
    health.beat_on(asyncio.get_running_loop())
    await asyncio.sleep(0.1)
    assert health.liveness().ok
    time.sleep(0.5)  # noqa: ASYNC251 - blocks this loop on purpose: no callback can run
    assert not health.liveness().ok
    await asyncio.sleep(0.15)  # the loop runs again, and so do the beats
    assert health.liveness().ok


def _call(app: Any, path: str) -> tuple[str, dict[str, str], bytes]:
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""}
    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def test_the_wsgi_app_answers_probes_and_passes_everything_else_to_metrics() -> None:
    health = Health(stall_after=3.0, beat_every=0.5)
    health.ready_when(lambda: True)
    calls: list[str] = []

    def metrics_app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        calls.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"runfleet_runs_in_flight 0\n"]

    app = health.wrap(metrics_app)
    status, headers, body = _call(app, LIVENESS_PATH)
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    assert json.loads(body)["ok"] is True
    status, _, body = _call(app, READINESS_PATH)
    assert status == "200 OK" and json.loads(body) == {"ok": True, "reason": "ready"}
    assert _call(app, "/metrics")[2].startswith(b"runfleet_")
    assert calls == ["/metrics"]
    health.stopping()
    status, _, body = _call(app, READINESS_PATH)
    assert status.startswith("503") and json.loads(body)["reason"] == "stopping"


# ---- real worker processes -------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(_get, port, path)


async def status_becomes(port: int, path: str, code: int, timeout: float, what: str) -> None:
    async def check() -> bool:
        try:
            return (await probe(port, path))[0] == code
        except OSError:
            return False

    await until(check, timeout, what)


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}"))


@pytest.fixture
async def db_proxy(settings: Settings) -> AsyncIterator[FreezableProxy]:
    parts = urlsplit(settings.database_url)
    proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()


async def test_readiness_follows_the_lease_and_the_stop_while_liveness_holds(
    settings: Settings, store: Store, db_proxy: FreezableProxy
) -> None:
    port = free_port()
    proc = WorkerProc(
        settings,
        database_url=via(settings.database_url, db_proxy.port),
        extra_args=["--metrics-port", str(port)],
    )
    try:
        await proc.wait_started()
        await status_becomes(port, READINESS_PATH, 200, 10, "ready once started")
        assert (await probe(port, LIVENESS_PATH))[0] == 200
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        )
        assert b"runfleet_claim_outcomes_total" in metrics, "the exposition is still served"

        # Cut the worker off from Postgres: its lease lapses (0.6 s with these settings),
        # so it is not available capacity — but it is alive and must not be restarted.
        db_proxy.freeze()
        await status_becomes(port, READINESS_PATH, 503, 10, "unready after the lease lapsed")
        code, body = await probe(port, READINESS_PATH)
        assert (code, body["reason"]) == (503, "not-started-or-lease-unconfirmed")
        assert (await probe(port, LIVENESS_PATH))[0] == 200
        db_proxy.thaw()
        await status_becomes(port, READINESS_PATH, 200, 15, "ready again once reconfirmed")

        # Stop with a run in flight: not ready from the first SIGTERM, alive while draining.
        async with AsyncQueue("default", settings=settings) as queue:
            run = await queue.enqueue(flows.sleepy, 4000, "health")
            await until(lambda: running_on(store, run.id, proc.pid), 10, "the run on the worker")
        proc.signal(signal.SIGTERM)
        await status_becomes(port, READINESS_PATH, 503, 5, "unready once stopping")
        code, body = await probe(port, READINESS_PATH)
        assert (code, body["reason"]) == (503, "stopping")
        assert (await probe(port, LIVENESS_PATH))[0] == 200
        assert await proc.wait_exit(20) == 0
    except BaseException:
        print(proc.log()[-4000:])
        raise
    finally:
        proc.close()


async def test_liveness_fails_while_a_flow_blocks_the_event_loop(
    settings: Settings, store: Store, tmp_path: Any
) -> None:
    # Long lease timings so that neither the lapse nor the fail-stop watchdog acts
    # during the block: only the health endpoint should notice it (stall after 3 s).
    port = free_port()
    proc = WorkerProc(
        settings,
        heartbeat_interval=1.0,
        stale_after=30.0,
        extra_args=["--metrics-port", str(port)],
    )
    try:
        await proc.wait_started()
        await status_becomes(port, LIVENESS_PATH, 200, 10, "alive once started")
        async with AsyncQueue("default", settings=settings) as queue:
            run = await queue.enqueue(flows.block_loop, str(tmp_path / "ledger"), 6.0)
            await until(lambda: running_on(store, run.id, proc.pid), 10, "the run on the worker")
            # The HTTP thread answers throughout; the answer turns 503 from the loop's stall.
            await status_becomes(port, LIVENESS_PATH, 503, 8, "503 while the loop is blocked")
            code, body = await probe(port, LIVENESS_PATH)
            if code == 503:
                assert body["loop_age_s"] >= body["stall_after_s"] == 3.0
            await status_becomes(port, LIVENESS_PATH, 200, 10, "200 once the loop runs again")
            assert (await run.result(timeout=15))["pid"] == proc.pid
        proc.signal(signal.SIGTERM)
        assert await proc.wait_exit(20) == 0
    except BaseException:
        print(proc.log()[-4000:])
        raise
    finally:
        proc.close()
