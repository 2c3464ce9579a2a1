"""A DBOS executor process: the peer's side of the flows benchmark.

Run as ``python -m bench.dbos_app`` with ``RF_BENCH_DBOS_URL`` (its system database),
``RF_BENCH_DBOS_CONCURRENCY`` (workflows per process) and ``RF_BENCH_DBOS_POLLING``
(queue polling interval, s). It registers the benchmark queue, launches DBOS, prints
``dbos.ready`` and runs until SIGTERM. The steps are the functions runfleet's flow
records (``three_steps``), wrapped with ``DBOS.step`` as a DBOS user would.

The decorators are applied as calls, not ``@`` syntax: where ``dbos`` is not installed,
mypy sees ``Any`` and an untyped decorator would fail ``--strict``.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from dbos import DBOS, DBOSConfig

from runfleet.ops.bench import three_steps as work

APP = "rf-bench"
VERSION = "rf-bench-1"
QUEUE = "rf_bench_flows"
WORKFLOW = "rf_bench.three_steps"

add_one: Any = DBOS.step(name="rf_bench.add_one")(work.add_one)
double: Any = DBOS.step(name="rf_bench.double")(work.double)
subtract_one: Any = DBOS.step(name="rf_bench.subtract_one")(work.subtract_one)


def _three_steps(x: int) -> int:
    return int(subtract_one(double(add_one(x))))


three_steps: Any = DBOS.workflow(name=WORKFLOW)(_three_steps)


def config(url: str) -> DBOSConfig:
    return {
        "name": APP,
        "system_database_url": url,
        "application_version": VERSION,
        "executor_id": f"rf-bench-{os.getpid()}",
        "log_level": "WARNING",
    }


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS(config=config(os.environ["RF_BENCH_DBOS_URL"]))
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=int(os.environ["RF_BENCH_DBOS_CONCURRENCY"]),
        polling_interval_sec=float(os.environ["RF_BENCH_DBOS_POLLING"]),
        on_conflict="always_update",
    )
    print("dbos.ready", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=1)


if __name__ == "__main__":
    main()
