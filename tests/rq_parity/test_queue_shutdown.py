"""A sync Queue garbage-collected, or left open at interpreter exit, shuts down quietly.

No "Task was destroyed but it is pending!" per pool worker task, which is what a daemon
loop thread dying with the tasks still on it prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runfleet.store.config import Settings

SCRIPT = """
import gc, sys
import runfleet.rqface
from tests.rq_parity import jobs
q = runfleet.rqface.Queue("default", database_url=sys.argv[1], redis_url=sys.argv[2])
job = q.enqueue(jobs.add, 1, 2)
assert job.is_queued
if sys.argv[3] == "collect":
    del q, job
    gc.collect()
    print("collected", flush=True)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("how", ["left-open", "collect"])
def test_no_pending_task_warnings(settings: Settings, how: str) -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, settings.database_url, settings.redis_url, how],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(root), "RUNFLEET_REDIS_PREFIX": settings.redis_prefix},
    )
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
    assert "Task was destroyed" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
