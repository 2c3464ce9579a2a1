"""Running worker processes: one in the foreground, or P children under a supervisor.

Signal handlers only set events. First SIGTERM/SIGINT: graceful stop (stop
reading, grace period, release). Second: release now. The supervisor forwards
signals to its children and restarts a child that died unexpectedly — each
restart is a new process, so a new owner identity (new nonce).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

import psycopg
import psycopg_pool

from runfleet.store.config import Settings
from runfleet.worker.health import Health, serve
from runfleet.worker.stopping import StopGuard, exit_now

log = logging.getLogger("runfleet.worker.supervisor")


@dataclass(frozen=True)
class WorkerOptions:
    flows: tuple[str, ...]
    queues: tuple[str, ...]
    concurrency: int
    metrics_port: int | None = None
    log_level: str = "INFO"
    log_json: bool = False
    allow_import: tuple[str, ...] = ()
    """Module prefixes whose plain functions may run (besides the ``--flows`` modules);
    empty: ``RUNFLEET_ALLOW_IMPORT``."""
    burst: bool = False
    """Exit once the queues hold nothing to run now (rq's ``--burst``)."""


def run_foreground(settings: Settings, options: WorkerOptions) -> NoReturn:
    """Run one worker in this process until signalled (or drained: ``--burst``), then end
    the process with its exit status (``Worker.exit_code``); StopGuard ends it within
    ``Settings.stop_deadline`` of the first stop, whatever the runs left. A database that
    cannot be reached at start is raised to the caller (nothing ran: no thread to skip)."""
    from runfleet.worker.logs import configure
    from runfleet.worker.process import Worker
    from runfleet.worker.resolver import load_flows

    configure(options.log_level, json_lines=options.log_json)
    load_flows(options.flows, options.allow_import or settings.allow_import_prefixes)
    health = Health.for_settings(settings)
    if options.metrics_port:
        serve(health, options.metrics_port)  # /metrics, /healthz, /readyz

    made: list[Worker] = []

    async def main() -> None:
        worker = Worker(
            settings, queues=options.queues, concurrency=options.concurrency, burst=options.burst
        )
        made.append(worker)
        loop = asyncio.get_running_loop()
        # Ready once started with a confirmed, unlapsed lease (LeaseGate.open: I/O-free).
        health.ready_when(lambda: worker.started.is_set() and worker.lease.gate.open())
        health.beat_on(loop)

        def on_stop() -> None:
            health.stopping()
            worker.stop()

        guard = StopGuard(loop, on_stop, settings.stop_deadline)
        guard.install()
        try:
            await worker.run()
        finally:
            guard.arm()  # stopped by itself (--burst) or crashed: the loop's cleanup is bounded too
            guard.close()

    code = 0
    try:
        run_loop(main(), settings.event_loop)
        code = made[0].exit_code if made else 0
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout):
        if made and made[0].started.is_set():
            log.exception("worker.crashed")
            code = 1
        else:
            raise  # the CLI says it in one line (``cannot reach the database at ...``)
    except SystemExit as exc:  # raised past every containment: keep its status
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the process ends here either way: say why, then go
        log.exception("worker.crashed")
        code = 1
    # Never the interpreter's exit: it joins every non-daemon thread a run's code left.
    exit_now(code)


def run_loop(main: Coroutine[Any, Any, None], loop: str = "uvloop") -> None:
    """Run the worker on uvloop where it is installed (a declared dependency off Windows):
    the hot path is socket I/O for many runs at once. Plain asyncio otherwise, or when
    ``RUNFLEET_EVENT_LOOP=asyncio``."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


PARENT_POLL_S = 0.5
"""How often a supervised child checks that its supervisor is still its parent."""


def _child(settings_json: str, options: WorkerOptions, port: int | None, parent: int) -> None:
    settings = Settings.model_validate_json(settings_json)
    exit_with_parent(parent, settings.grace_period)
    run_foreground(settings, WorkerOptions(**{**options.__dict__, "metrics_port": port}))


def exit_with_parent(parent: int, grace_period: float, poll_s: float = PARENT_POLL_S) -> None:
    """Stop this process once ``parent`` is no longer its parent (the supervisor was
    SIGKILLed or OOM-killed: nothing would forward a stop or restart it any more).

    A daemon thread polls the parent pid (as gunicorn's workers do) and sends this
    process the signals an operator would: one SIGTERM (the graceful stop: stop reading,
    the grace period, release), and a second after the grace period and five seconds
    more (release now). Without it an orphaned child kept running, unsupervised, for as
    long as its servers answered, or retried them for ever once they were gone.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("supervisor.gone", extra={"supervisor": parent, "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_period + 5.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="runfleet-parent-watch", daemon=True).start()


def supervise(settings: Settings, options: WorkerOptions, processes: int) -> int:
    """Start ``processes`` children; restart crashed ones; forward stop signals.

    ``--burst``: a child that exits drained (``EXIT_DRAINED`` or ``EXIT_LEFT_BEHIND``) is
    done, not restarted; the supervisor exits once every child is done, with the highest
    status any of them exited with."""
    from runfleet.worker.burst import EXIT_DRAINED, EXIT_LEFT_BEHIND

    ctx = mp.get_context("spawn")
    stopping: dict[str, float] = {"signals": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signals"] += 1
        stopping.setdefault("since", time.monotonic())
        for proc in children.values():
            if proc.is_alive() and proc.pid:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def start(slot: int) -> mp.process.BaseProcess:
        port = options.metrics_port + slot if options.metrics_port else None
        proc = ctx.Process(
            target=_child,
            args=(settings.model_dump_json(), options, port, os.getpid()),
            name=f"runfleet-worker-{slot}",
        )
        proc.start()
        log.info("supervisor.child_started", extra={"slot": slot, "pid": proc.pid})
        return proc

    children: dict[int, mp.process.BaseProcess] = {}
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for slot in range(processes):
        children[slot] = start(slot)
    restarts: dict[int, list[float]] = {slot: [] for slot in children}
    drained: dict[int, int] = {}
    while True:
        time.sleep(0.2)
        if stopping["signals"]:
            # Only a stop request ends the supervisor: children that all died at once
            # (every one fail-stopped on the same partition) are restarted like one.
            if all(not p.is_alive() for p in children.values()):
                break
            if time.monotonic() - stopping["since"] > settings.stop_deadline + KILL_AFTER_S:
                _kill_left(children)  # each child ends itself by its deadline; a backstop
            continue
        if len(drained) == len(children):
            break
        for slot, proc in list(children.items()):
            if proc.is_alive() or slot in drained:
                continue
            if options.burst and proc.exitcode in (EXIT_DRAINED, EXIT_LEFT_BEHIND):
                drained[slot] = proc.exitcode
                continue
            log.warning(
                "supervisor.child_died",
                extra={"slot": slot, "pid": proc.pid, "exitcode": proc.exitcode},
            )
            recent = [t for t in restarts[slot] if time.monotonic() - t < 60]
            delay = min(10.0, 0.5 * 2 ** len(recent))
            time.sleep(delay)
            if stopping["signals"]:
                break  # a stop arrived during the backoff: start nothing new
            restarts[slot] = [*recent, time.monotonic()]
            children[slot] = start(slot)
    return max(drained.values(), default=EXIT_DRAINED)


KILL_AFTER_S = 2.0
"""How long past a child's own stop deadline the supervisor waits before it SIGKILLs it."""


def _kill_left(children: dict[int, mp.process.BaseProcess]) -> None:
    for slot, proc in children.items():
        if proc.is_alive() and proc.pid:
            log.error("supervisor.child_killed", extra={"slot": slot, "pid": proc.pid})
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def parse_csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())
