"""rq's ``tests/fixtures.py`` functions the ported rq tests enqueue (tests/rq_parity/test_rq_*).

Importable by an rq worker and a runfleet worker alike. rq's fixtures write what a callback
saw into Redis (``connection.set``); these write it to files under ``RQ_PARITY_OUT`` (set
per test by the ``rqx`` fixture), which either side's worker, in the test's process, sees.
"""

from __future__ import annotations

import os
import time
import traceback as tb_module
from pathlib import Path
from typing import Any

import rq

from runfleet import rqface


def _out(name: str) -> Path:
    return Path(os.environ["RQ_PARITY_OUT"]) / name


def saved(name: str) -> str | None:
    """What a callback saved under ``name``, or None."""
    path = _out(name)
    return path.read_text() if path.exists() else None


def say_hello(name: str | None = None) -> str:
    return f"Hi there, {name or 'Stranger'}!"


async def say_hello_async(name: str | None = None) -> str:
    return f"Hi there, {name or 'Stranger'}!"


def do_nothing() -> None:
    pass


def say_pid() -> int:
    return os.getpid()


def div_by_zero(x: int = 1) -> float:
    return x / 0


def some_calculation(x: int, y: int, z: int = 1) -> int:
    return x * y / z  # type: ignore[return-value]  # rq's own fixture, ported as written (it returns a float)


def echo(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return args, kwargs


def long_running_job(timeout: float = 10) -> str:
    time.sleep(timeout)
    return "Done sleeping..."


def access_self() -> list[str]:
    """Which of the two ``get_current_job`` answers inside a job (the running side's only)."""
    return [j.id for j in (rq.get_current_job(), rqface.get_current_job()) if j is not None]


def check_dependencies_are_met() -> bool:
    job = rq.get_current_job() or rqface.get_current_job()
    assert job is not None
    return bool(job.dependencies_are_met())


def modify_self(meta: dict[str, Any]) -> None:
    job = rq.get_current_job() or rqface.get_current_job()
    assert job is not None
    job.meta.update(meta)
    job.save_meta()


def modify_self_and_save(meta: dict[str, Any]) -> str:
    """rq code that saves its job whole (``save()``, not ``save_meta()``)."""
    job = rq.get_current_job() or rqface.get_current_job()
    assert job is not None
    job.meta.update(meta)
    job.save()
    return "saved"


def fail_once(name: str) -> str:
    """Fails on its first call for ``name``, then returns ``"second time"``."""
    marker = _out(f"fail_once:{name}")
    if not marker.exists():
        marker.write_text("failed")
        raise ValueError("first time")
    return "second time"


def returns_retry(name: str, times: int, max_retries: int = 3) -> Any:
    """Returns ``Retry(max=max_retries)`` on its first ``times`` calls for ``name`` (rq's
    class on rq's side, runfleet's on runfleet's), then ``"done after N"``."""
    marker = _out(f"returns_retry:{name}")
    calls = int(marker.read_text()) + 1 if marker.exists() else 1
    marker.write_text(str(calls))
    if calls > times:
        return f"done after {calls}"
    on_runfleet = rqface.get_current_job() is not None
    return (rqface.Retry if on_runfleet else rq.Retry)(max=max_retries)


def modify_self_and_error(meta: dict[str, Any]) -> None:
    """rq's fixture: saves meta in the job, then fails."""
    modify_self(meta)
    raise ValueError("modified myself, then failed")


def create_file(name: str) -> None:
    """rq's fixture: evidence that the job ran."""
    _out(f"created:{name}").write_text("ran")


def save_result(job: Any, connection: Any, result: Any) -> None:
    _out(f"success_callback:{job.id}").write_text(str(result))


def save_exception(job: Any, connection: Any, type: Any, value: Any, traceback: Any) -> None:
    text = traceback if isinstance(traceback, str) else "".join(tb_module.format_tb(traceback))
    _out(f"failure_callback:{job.id}").write_text(f"{value}\n{text}")


def save_status_on_success(job: Any, connection: Any, result: Any) -> None:
    _out(f"success_callback_status:{job.id}").write_text(str(job.get_status(refresh=False).value))


def save_status_on_failure(
    job: Any, connection: Any, type: Any, value: Any, traceback: Any
) -> None:
    _out(f"failure_callback_status:{job.id}").write_text(str(job.get_status(refresh=False).value))


def erroneous_callback(job: Any, *args: Any) -> None:
    raise ValueError("job is not allowed to succeed")


class ClassWithAStaticMethod:
    @staticmethod
    def static_method() -> str:
        return "I'm a static method"


def spin(seconds: float) -> str:
    """Busy for ``seconds`` in short sleeps (rq's timeout tests' ``long_running_job``)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)
    return "done"


def save_stopped(job: Any, connection: Any) -> None:
    _out(f"stopped_callback:{job.id}").write_text(str(job.get_status(refresh=False).value))
