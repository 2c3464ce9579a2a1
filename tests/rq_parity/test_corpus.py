"""The rq snippet corpus (snippets.py) on real rq and on runfleet: the same answers.

rq side: a real ``rq worker --with-scheduler`` process (SimpleWorker) against Redis.
runfleet side: a runfleet worker against Postgres and Redis. The snippet code is the
same function; only the setup (the import: Queue/Job/Retry, and the URL) differs.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import rq

from bench.rq_side import RQ_WORKER
from runfleet import rqface
from runfleet.store.config import Settings
from tests.rq_parity.conftest import ThreadWorker
from tests.rq_parity.snippets import SNIPPETS, Api

ROOT = Path(__file__).resolve().parents[2]
RQ_QUEUE = "rqparity"


@pytest.fixture
def rq_worker(redis_url: str) -> Iterator[str]:
    """A real rq worker process with its scheduler, serving a queue of this test's own
    (rq's registries are per queue: a fresh queue starts as empty as runfleet's database)."""
    name = f"rqparity-{uuid.uuid4().hex[:8]}"
    rq_bin = Path(sys.executable).with_name("rq")
    command = [str(rq_bin), "worker", "-u", redis_url, "-s",
               "-w", RQ_WORKER]  # fmt: skip
    proc = subprocess.Popen(
        [*command, "-P", str(ROOT), name],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield name
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def on_rq(redis_url: str, queue_name: str, tmp: Path) -> Api:
    conn = redis.Redis.from_url(redis_url)
    return Api(
        Queue=lambda name: rq.Queue(name, connection=conn),
        Job=rq.job.Job,
        Retry=rq.Retry,
        Callback=rq.Callback,
        conn=conn,
        queue_name=queue_name,
        idle_queue_name=f"{queue_name}-idle-{uuid.uuid4().hex[:6]}",
        tmp=tmp,
    )


def on_runfleet(settings: Settings, tmp: Path, opened: list[rqface.Queue]) -> Api:
    def queue(name: str) -> rqface.Queue:
        q = rqface.Queue(
            name,
            database_url=settings.database_url,
            redis_url=settings.redis_url,
            settings=settings,
        )
        opened.append(q)
        return q

    return Api(
        Queue=queue,
        Job=rqface.Job,
        Retry=rqface.Retry,
        Callback=rqface.Callback,
        conn=queue(RQ_QUEUE),
        queue_name=RQ_QUEUE,
        idle_queue_name=f"{RQ_QUEUE}-idle",
        tmp=tmp,
    )


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.__name__)
def test_snippet_answers_the_same(
    snippet: Callable[[Api], dict[str, Any]],
    rq_worker: str,
    redis_url: str,
    settings: Settings,
    tmp_path: Path,
) -> None:
    (tmp_path / "rq").mkdir()
    (tmp_path / "runfleet").mkdir()
    on_real_rq = snippet(on_rq(redis_url, rq_worker, tmp_path / "rq"))

    worker = ThreadWorker(settings, [RQ_QUEUE]).start()
    opened: list[rqface.Queue] = []
    try:
        on_ours = snippet(on_runfleet(settings, tmp_path / "runfleet", opened))
    finally:
        for q in opened:
            q.close()
        worker.stop()
    assert on_ours == on_real_rq
