"""Health endpoints for orchestrators, served beside ``/metrics`` on ``--metrics-port``.

``GET /healthz`` (liveness) answers 200 while the worker's *event loop* keeps running
callbacks, 503 once it has not for ``stall_after`` seconds. The HTTP server runs in its
own thread, so answering at all proves nothing about the loop: the loop itself stamps
a monotonic time every ``beat_every`` seconds (``Health.beat_on``), and the handler only
reads that stamp. CPU-bound code or a sync call blocking the loop stops the stamps while
the handler thread still answers (it gets the GIL between bytecodes) — with 503.

``GET /readyz`` (readiness) answers 200 while the worker has started, its lease is
confirmed and not lapsed (the lease gate: a local, I/O-free check, safe from any thread),
the loop is not stalled, and no stop signal was received. A lapsed worker claims
nothing, and a stopping one reads nothing, so neither counts as available capacity.
Readiness never restarts anything: it gates rollouts and PodDisruptionBudget accounting.
A Postgres outage makes every worker unready at once, by design.

Bodies are one small JSON object saying why, for ``kubectl describe`` and humans.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from runfleet.store.config import Settings

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One probe answer: HTTP 200 when ``ok``, else 503; ``detail`` says why."""

    ok: bool
    detail: dict[str, object]

    @property
    def status(self) -> str:
        return "200 OK" if self.ok else "503 Service Unavailable"


class Health:
    """What the probes answer, fed by the worker's event loop and read by the HTTP thread.

    Only plain attribute writes cross threads (a float, a bool), so no lock is needed.
    """

    def __init__(
        self,
        *,
        stall_after: float,
        beat_every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if beat_every <= 0 or stall_after <= beat_every:
            raise ValueError("stall_after must exceed beat_every > 0")
        self.stall_after = stall_after
        self.beat_every = beat_every
        self._clock = clock
        # Creation counts as a beat: the loop starts right after the server does, and a
        # loop that never starts is stalled ``stall_after`` later.
        self._last_beat = clock()
        self._ready: Callable[[], bool] = lambda: False
        self._stopping = False

    @classmethod
    def for_settings(cls, settings: Settings) -> Health:
        """Beats every ``loop_beat_every``; stalled after ``loop_stall_after``."""
        return cls(stall_after=settings.loop_stall_after, beat_every=settings.loop_beat_every)

    # ---- fed by the worker ---------------------------------------------------

    def beat(self) -> None:
        """The event loop is running callbacks now."""
        self._last_beat = self._clock()

    def beat_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stamp from ``loop`` every ``beat_every`` s for as long as the loop runs callbacks."""

        def tick() -> None:
            self.beat()
            loop.call_later(self.beat_every, tick)

        loop.call_soon(tick)

    def ready_when(self, check: Callable[[], bool]) -> None:
        """Readiness predicate, called from the HTTP thread: it must be I/O-free and cheap."""
        self._ready = check

    def stopping(self) -> None:
        """A stop signal arrived: not ready from now on (the process is draining)."""
        self._stopping = True

    # ---- read by the probes --------------------------------------------------

    def liveness(self) -> Verdict:
        age = self._clock() - self._last_beat
        detail: dict[str, object] = {"loop_age_s": round(age, 3), "stall_after_s": self.stall_after}
        return Verdict(age < self.stall_after, detail)

    def readiness(self) -> Verdict:
        alive = self.liveness()
        if not alive.ok:
            return Verdict(False, {"reason": "event-loop-stalled", **alive.detail})
        if self._stopping:
            return Verdict(False, {"reason": "stopping"})
        try:
            ready = self._ready()
        except Exception as exc:  # a probe answers; it never raises into the server
            return Verdict(False, {"reason": "check-failed", "error": repr(exc)})
        if not ready:
            return Verdict(False, {"reason": "not-started-or-lease-unconfirmed"})
        return Verdict(True, {"reason": "ready"})

    # ---- HTTP ----------------------------------------------------------------

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """``app`` (the Prometheus exposition) plus the two probe paths."""

        def health_app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == LIVENESS_PATH:
                verdict = self.liveness()
            elif path == READINESS_PATH:
                verdict = self.readiness()
            else:
                return app(environ, start_response)
            body = json.dumps({"ok": verdict.ok, **verdict.detail}).encode() + b"\n"
            start_response(
                verdict.status,
                [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(body))),
                    ("Cache-Control", "no-store"),
                ],
            )
            return [body]

        return health_app


class _QuietHandler(WSGIRequestHandler):
    """Probes arrive every few seconds: never log a line per request."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(
    health: Health, port: int, addr: str = "0.0.0.0"
) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` from a daemon thread.

    Replaces ``prometheus_client.start_http_server`` (same address, same exposition).
    """
    app = health.wrap(make_wsgi_app())
    httpd = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="runfleet-http", daemon=True)
    thread.start()
    return httpd, thread
