"""Plain functions the rq-parity snippets enqueue: importable by an rq worker and a runfleet one."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def add(a: int, b: int) -> int:
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


def fail_unless_exists(path: str) -> str:
    """Fails until ``path`` exists: a job that a requeue can fix."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return "ok"


def flaky(path: str, failures: int) -> int:
    """Fails ``failures`` times (counted in ``path``), then returns how many tries it took."""
    tries = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(tries))
    if tries <= failures:
        raise RuntimeError(f"try {tries} of {failures + 1}")
    return tries


def record(path: str, text: str) -> str:
    """Appends ``text`` to ``path`` (dependency chains: the file shows the order)."""
    with open(path, "a") as f:
        f.write(text)
    return open(path).read()


def snooze(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


def report_success(job: Any, connection: Any, result: Any, *args: Any, **kwargs: Any) -> None:
    """rq's on_success signature; leaves ``<path>.success`` (path = the job's first arg)."""
    with open(f"{job.args[0]}.success", "w") as f:
        json.dump({"id": job.id, "result": result}, f)


def report_failure(job: Any, connection: Any, typ: type, value: Any, tb: Any) -> None:
    """rq's on_failure signature; leaves ``<path>.failure``."""
    with open(f"{job.args[0]}.failure", "w") as f:
        json.dump({"id": job.id, "error": typ.__name__, "message": str(value)}, f)
