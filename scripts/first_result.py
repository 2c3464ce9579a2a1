"""Seconds from nothing to a first job's result: runfleet (embedded), rq and DBOS.

Each system runs as its quickstart has a user run it, in a fresh folder, timed from the
start of the processes to the producer printing ``3`` (``add(1, 2)``):

- runfleet: ``runfleet worker`` and a producer process started together, no URL set, the
  ``embedded`` extra; cold is a fresh HOME (the pair is initialised, started and
  migrated), warm a second pair of processes once it runs;
- rq: ``rq worker`` and a producer process started together against ``--redis`` (rq has
  no data directory: cold is the first run in a fresh folder, warm the next);
- DBOS: one process (its model: the workflow runs where it is called), SQLite by default;
  cold creates the database file, warm finds it.

Run from a checkout with the ``bench`` and ``embedded`` extras::

    PYTHONPATH=. python scripts/first_result.py --redis redis://127.0.0.1:6379/0

rq's jobs go to a queue of a random name, so a shared Redis is not disturbed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = "def add(a: int, b: int) -> int:\n    return a + b\n"
RUNFLEET_PRODUCER = """\
from runfleet import Queue
from tasks import add
print(Queue("default").enqueue(add, 1, 2).wait(timeout=120))
"""
RQ_PRODUCER = """\
import sys
from redis import Redis
from rq import Queue
from tasks import add
job = Queue(sys.argv[2], connection=Redis.from_url(sys.argv[1])).enqueue(add, 1, 2)
print(job.latest_result(timeout=120).return_value)
"""
DBOS_APP = """\
from dbos import DBOS

DBOS(config={"name": "first_result"})


@DBOS.step()
def add(a: int, b: int) -> int:
    return a + b


@DBOS.workflow()
def total(a: int, b: int) -> int:
    return add(a, b)


DBOS.launch()
print(total(1, 2))
DBOS.destroy()
"""


def _env(home: Path, app: Path) -> dict[str, str]:
    drop = ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL", "XDG_DATA_HOME")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("DBOS_")}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(app), str(ROOT)]))
    return env


def _timed(worker: list[str] | None, producer: list[str], app: Path, env: dict[str, str]) -> float:
    """Seconds from starting both processes to the producer printing 3."""
    began = time.monotonic()
    proc = None
    if worker is not None:
        proc = subprocess.Popen(
            worker, cwd=app, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        done = subprocess.run(producer, cwd=app, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - began
        if done.returncode != 0 or done.stdout.strip().splitlines()[-1:] != ["3"]:
            raise RuntimeError(f"{producer}: {done.stdout}{done.stderr}")
        return elapsed
    finally:
        if proc is not None:  # timed already: a slow teardown is not the user's wait
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def runfleet(tmp: Path, warm_runs: int) -> tuple[float, list[float]]:
    home, app = tmp / "home", tmp / "app"
    home.mkdir()
    app.mkdir()
    (app / "tasks.py").write_text(TASKS)
    (app / "produce.py").write_text(RUNFLEET_PRODUCER)
    env = _env(home, app)
    worker = [sys.executable, "-m", "runfleet.ops", "worker", "--flows", "tasks"]
    producer = [sys.executable, "produce.py"]
    try:
        cold = _timed(worker, producer, app, env)
        warm = [_timed(worker, producer, app, env) for _ in range(warm_runs)]
    finally:
        stop = [sys.executable, "-m", "runfleet.ops", "dev", "stop"]
        subprocess.run(stop, cwd=app, env=env, capture_output=True)
    return cold, warm


def rq(tmp: Path, redis_url: str, warm_runs: int) -> tuple[float, list[float]]:
    app = tmp / "rq"
    app.mkdir()
    (app / "tasks.py").write_text(TASKS)
    (app / "produce.py").write_text(RQ_PRODUCER)
    env = _env(tmp, app)
    queue = f"first-result-{uuid.uuid4().hex[:8]}"
    rq_bin = str(Path(sys.executable).parent / "rq")
    # bench/rq_worker.py: rq's SimpleWorker, its command poll 0.2 s instead of 60 (with
    # redis-py 8 rq's own otherwise stalls up to a minute in its teardown).
    worker_class = "bench.rq_worker.SimpleWorker"
    worker = [rq_bin, "worker", "--url", redis_url, "--worker-class", worker_class, queue]
    producer = [sys.executable, "produce.py", redis_url, queue]
    cold = _timed(worker, producer, app, env)
    return cold, [_timed(worker, producer, app, env) for _ in range(warm_runs)]


def dbos(tmp: Path, warm_runs: int) -> tuple[float, list[float]]:
    app = tmp / "dbos"
    app.mkdir()
    (app / "app.py").write_text(DBOS_APP)
    env = _env(tmp, app)
    cold = _timed(None, [sys.executable, "app.py"], app, env)
    return cold, [_timed(None, [sys.executable, "app.py"], app, env) for _ in range(warm_runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="rq's Redis")
    parser.add_argument("--warm", type=int, default=3, help="warm runs per system")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="first-result-") as tmp:
        results = {
            "runfleet (embedded)": runfleet(Path(tmp), args.warm),
            "rq": rq(Path(tmp), args.redis, args.warm),
            "DBOS (SQLite)": dbos(Path(tmp), args.warm),
        }
    print(f"load average before: {load:.2f}, after: {os.getloadavg()[0]:.2f}")
    print(f"| system | cold | warm (median of {args.warm}) |")
    print("|---|---|---|")
    for name, (cold, warm) in results.items():
        print(f"| {name} | {cold:.1f} s | {statistics.median(warm):.1f} s |")


if __name__ == "__main__":
    main()
