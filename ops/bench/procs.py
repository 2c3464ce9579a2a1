"""The worker processes a benchmark starts, and how it waits for them to read their queues.

Workers are real ``python -m runfleet.ops worker`` processes configured only through
``RUNFLEET_*`` environment variables built from one ``Settings`` (as the fleet tests start
them), so a benchmark measures exactly what an operator would run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import runfleet
from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.ops.bench.scratch import BenchError
from runfleet.store.config import Settings

# The folder runfleet/ is in (a checkout, or site-packages): what children import it from.
ROOT = Path(runfleet.__file__).resolve().parents[1]


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def settings_env(settings: Settings, **overrides: object) -> dict[str, str]:
    values = {f"RUNFLEET_{k.upper()}": str(v) for k, v in settings.model_dump().items()}
    values.update({f"RUNFLEET_{k.upper()}": str(v) for k, v in overrides.items()})
    return python_env(values)


class Proc:
    """A child process logging to a temp file; ``close()`` kills it if still running."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="rf-bench-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(argv), env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM (graceful stop), SIGKILL if it is still there after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.kill()
        self._log.close()
        self.log_path.unlink(missing_ok=True)


def runfleet_worker(
    settings: Settings,
    *,
    flows: str,
    queues: str,
    concurrency: int,
    **overrides: object,
) -> Proc:
    """One ``python -m ops worker`` process (its own owner identity)."""
    argv = [
        sys.executable, "-m", "runfleet.ops", "worker", "--flows", flows, "--queues", queues,
        "--concurrency", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip
    return Proc(argv, settings_env(settings, **overrides))


async def wait_workers_started(settings: Settings, procs: Sequence[Proc], timeout: float) -> None:
    """Until every process has written its liveness key (it is reading its queues)."""
    redis = connect(settings)
    liveness = Liveness(redis, settings.redis_prefix, settings.host_id)
    wanted = {p.pid for p in procs}
    deadline = time.monotonic() + timeout
    try:
        while True:
            for proc in procs:
                if proc.proc.poll() is not None:
                    raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")
            if wanted <= {m.pid for m in await liveness.fleet()}:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"workers {sorted(wanted)} did not start in {timeout:.0f}s")
            await asyncio.sleep(0.05)
    finally:
        await redis.aclose()
