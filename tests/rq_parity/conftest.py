"""A runfleet worker on a thread of its own, so synchronous producer code (rq-shaped)
can run in the test's thread while the worker executes the runs."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runfleet.store.config import Settings
from runfleet.worker.process import Worker

ROOT = Path(__file__).resolve().parents[2]


class ThreadWorker:
    def __init__(self, settings: Settings, queues: list[str]) -> None:
        self._settings = settings
        self._queues = queues
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: Worker | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadWorker:
        self._ready.clear()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(20), "worker did not start"
        return self

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._worker = Worker(self._settings, queues=self._queues, concurrency=4)
        task = asyncio.create_task(self._worker.run())
        await asyncio.wait_for(self._worker.started.wait(), 15)
        self._ready.set()
        await task

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._worker is None:
            return
        worker = self._worker
        self._loop.call_soon_threadsafe(lambda: worker.stop(hard=True))
        self._thread.join(20)
        assert not self._thread.is_alive(), "worker thread did not stop"
        self._thread = None


@pytest.fixture
def thread_worker(settings: Settings) -> Iterator[ThreadWorker]:
    """A worker on the ``default`` queue, not yet started (``.start()`` it when wanted)."""
    tw = ThreadWorker(settings, ["default"])
    try:
        yield tw
    finally:
        tw.stop()


# ---- rq's own tests, ported (tests/rq_parity/test_rq_*.py) -------------------------------
#
# Each ported test takes ``rqx``: the same test body runs once against real rq (a throwaway
# redis-server of this session, an rq ``SimpleWorker`` bursting in the test's process, as
# rq's own suite runs it) and once against runfleet (this test's database, a runfleet
# worker bursting in the test's process). What differs is only what rq's suite would
# change to move: the import (``rqx.Queue``, ``rqx.Job``, ...), the connection
# (``rqx.connection``: a Redis client, or a runfleet ``Queue`` whose settings it carries)
# and the worker (``rqx.work(q, ...)``: ``SimpleWorker(...).work(burst=True)``, or
# ``runfleet worker --burst``'s ``Worker(burst=True)``).


@dataclass
class Side:
    name: str
    connection: Any
    Queue: Any
    """Called, a queue on this side's connection; otherwise the class (``Queue.all``)."""
    Job: Any
    JobStatus: Any
    Result: Any
    Retry: Any
    Callback: Any
    Dependency: Any
    registry: Any
    """The module holding the registries (rq.registry / rqface.registries)."""
    exceptions: Any
    """The module holding InvalidJobOperation and NoSuchJobError."""
    get_current_job: Callable[[], Any]
    job: Callable[..., Any]
    """The ``@job`` decorator."""
    cancel_job: Callable[..., Any]
    requeue_job: Callable[..., Any]
    send_stop_job_command: Callable[..., Any]
    work: Callable[..., None]
    """Burst-work the queues in this thread until they are drained."""
    work_in_background: Callable[..., Any]
    """Burst-work the queues in the background; ``.join()`` the answer."""
    work_forking_in_background: Callable[..., Any]
    """The same with rq's forking ``Worker`` (what ``stop-job`` needs) on rq's side."""


class _QueueClass:
    """``rqx.Queue``: called, a queue on this side's connection; otherwise the class
    (``Queue.all``, ``Queue.prepare_data``)."""

    def __init__(self, cls: Any, make: Callable[..., Any]) -> None:
        self._cls = cls
        self._make = make

    def __call__(self, name: str = "default", **kwargs: Any) -> Any:
        return self._make(name, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cls, name)


class _Process:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def join(self, timeout: float | None = None) -> None:
        self._proc.wait(timeout)


@pytest.fixture(scope="session")
def rq_redis() -> Iterator[str]:
    """A redis-server of this session for the rq control: rq's keys (``rq:queue:default``,
    ``rq:queues``) are global, so it cannot share the shared server with other tests."""
    from runfleet.ops.servers.redis import ThrowawayRedis

    server = ThrowawayRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


def _rq_side(url: str) -> Side:
    import rq
    import rq.command
    import rq.decorators
    import rq.exceptions
    import rq.job
    import rq.registry
    import rq.results
    from redis import Redis

    # redis-py 8 reads with a 5 s socket timeout by default: rq's blocking
    # ``latest_result(timeout=)`` (XREAD BLOCK) outlasts it when the worker is slow to start
    conn = Redis.from_url(url, socket_timeout=120)
    conn.flushdb()  # this session's own throwaway server: each test starts empty, as in rq's suite

    def queue(name: str = "default", **kwargs: Any) -> Any:
        kwargs.setdefault("connection", conn)
        return rq.Queue(name, **kwargs)

    from bench.rq_side import RQ_WORKER
    from bench.rq_worker import SimpleWorker

    def work(*queues: Any) -> None:
        SimpleWorker(list(queues), connection=conn).work(burst=True)

    def work_in_background(*queues: Any, forking: bool = False) -> _Process:
        # rq's worker installs signal handlers: off the main thread it is a process
        rq_bin = Path(sys.executable).with_name("rq")
        worker_class = "bench.rq_worker.Worker" if forking else RQ_WORKER
        command = [str(rq_bin), "worker", "--burst", "-u", url, "-w", worker_class]
        return _Process(
            subprocess.Popen(
                [*command, "-P", str(ROOT), *[q.name for q in queues]],
                cwd=ROOT,
                env={**os.environ},
                stdout=subprocess.DEVNULL,
            )
        )

    return Side(
        name="rq",
        connection=conn,
        Queue=_QueueClass(rq.Queue, queue),
        Job=rq.job.Job,
        JobStatus=rq.job.JobStatus,
        Result=rq.results.Result,
        Retry=rq.Retry,
        Callback=rq.Callback,
        Dependency=rq.job.Dependency,
        registry=rq.registry,
        exceptions=rq.exceptions,
        get_current_job=rq.get_current_job,
        job=rq.decorators.job,
        cancel_job=rq.cancel_job,
        requeue_job=rq.requeue_job,
        send_stop_job_command=rq.command.send_stop_job_command,
        work=work,
        work_in_background=work_in_background,
        work_forking_in_background=functools.partial(work_in_background, forking=True),
    )


def _runfleet_side(settings: Settings, opened: list[Any]) -> Side:
    import runfleet.rqface
    import runfleet.rqface.registries
    from runfleet.worker.process import Worker

    def queue(name: str = "default", **kwargs: Any) -> Any:
        kwargs.setdefault("connection", conn)
        q = runfleet.rqface.Queue(name, **kwargs)
        opened.append(q)
        return q

    conn = runfleet.rqface.Queue("default", settings=settings)
    opened.append(conn)

    def work_in_background(*queues: Any) -> threading.Thread:
        names = [getattr(q, "name", q) for q in queues]
        worker = Worker(settings, queues=names, concurrency=4, burst=True)
        runner = threading.Thread(target=asyncio.run, args=(worker.run(),), daemon=True)
        runner.start()
        return runner

    def work(*queues: Any) -> None:
        runner = work_in_background(*queues)
        runner.join(120)
        assert not runner.is_alive(), "burst worker did not exit"

    return Side(
        name="runfleet",
        connection=conn,
        Queue=_QueueClass(runfleet.rqface.Queue, queue),
        Job=runfleet.rqface.Job,
        JobStatus=runfleet.rqface.JobStatus,
        Result=runfleet.rqface.Result,
        Retry=runfleet.rqface.Retry,
        Callback=runfleet.rqface.Callback,
        Dependency=runfleet.rqface.Dependency,
        registry=runfleet.rqface.registries,
        exceptions=runfleet.rqface,
        get_current_job=runfleet.rqface.get_current_job,
        job=runfleet.rqface.job,
        cancel_job=runfleet.rqface.cancel_job,
        requeue_job=runfleet.rqface.requeue_job,
        send_stop_job_command=runfleet.rqface.send_stop_job_command,
        work=work,
        work_in_background=work_in_background,
        work_forking_in_background=work_in_background,
    )


@pytest.fixture(params=["rq", "runfleet"])
def rqx(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Side]:
    monkeypatch.setenv("RQ_PARITY_OUT", str(tmp_path))
    if request.param == "rq":
        yield _rq_side(request.getfixturevalue("rq_redis"))
        return
    opened: list[Any] = []
    try:
        yield _runfleet_side(request.getfixturevalue("settings"), opened)
    finally:
        for q in reversed(opened):
            q.close()


@pytest.fixture
def rf(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Side]:
    """The ``rqx`` runfleet side alone, for what rq does differently or keeps in Redis
    (test_rq_stopped.py, test_rq_sources.py, test_rq_result.py)."""
    monkeypatch.setenv("RQ_PARITY_OUT", str(tmp_path))
    opened: list[Any] = []
    try:
        yield _runfleet_side(settings, opened)
    finally:
        for q in reversed(opened):
            q.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A ported rq test that names a difference runfleet keeps on purpose
    (``@pytest.mark.rq_difference("why")``, listed in docs/how-to/moving-from-rq.md) still runs on
    both sides: on rq it must pass, on runfleet it must fail (strict xfail), so the day
    runfleet starts passing it — or rq stops — the suite says so."""
    for item in items:
        marker = item.get_closest_marker("rq_difference")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None or callspec.params.get("rqx") != "runfleet":
            continue
        item.add_marker(pytest.mark.xfail(strict=True, reason=str(marker.args[0])))
