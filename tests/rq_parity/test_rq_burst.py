"""``runfleet worker --burst`` (rq's ``rq worker --burst``): a real worker process drains its
queues, leaving what cannot run now (a job scheduled for later, a dependent of a failed
job) as rq's burst worker leaves it, then exits 0."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

from runfleet.rqface import Job, Queue
from runfleet.store.config import Settings
from tests.fleet.procs import ROOT, settings_env
from tests.rq_parity import rq_fixtures as fixtures


def test_a_burst_worker_process_drains_then_exits(settings: Settings) -> None:
    with Queue("default", settings=settings) as q:
        done = [q.enqueue(fixtures.say_hello, str(i)) for i in range(5)]
        failed = q.enqueue(fixtures.div_by_zero)
        blocked = q.enqueue(fixtures.say_hello, depends_on=failed)
        later = q.enqueue_in(timedelta(hours=1), fixtures.say_hello)
        proc = subprocess.run(
            [sys.executable, "-m", "runfleet.ops", "worker", "--burst", "--queues", "default",
             "--allow-import", "tests", "--log-level", "INFO"],
            env=settings_env(settings), cwd=ROOT, capture_output=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        assert b"worker.burst_drained" in proc.stdout + proc.stderr
        assert [j.return_value() for j in done] == [f"Hi there, {i}!" for i in range(5)]
        assert failed.is_failed and blocked.is_deferred and later.is_scheduled
        assert Job.fetch(later.id, connection=q).get_status() == "scheduled"
