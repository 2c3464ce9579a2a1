"""A user with no URLs set: a fresh HOME, an app folder, and runfleet processes in it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
URL_VARS = ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL", "XDG_DATA_HOME")

TASKS = """\
def add(a: int, b: int) -> int:
    return a + b
"""

PRODUCE = """\
import sys

from runfleet import Queue

from tasks import add

q = Queue("default")
job = q.enqueue(add, 1, 2, job_id=sys.argv[1])
print(job.wait(timeout=90))
"""


@dataclass
class User:
    """One user's machine as runfleet sees it: HOME (the data dir under it) and an app."""

    home: Path
    app: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def fresh(cls, tmp: Path) -> User:
        home, app = fresh_home(), tmp / "app"
        app.mkdir()
        (app / "tasks.py").write_text(TASKS)
        (app / "produce.py").write_text(PRODUCE)
        return cls(home, app)

    @property
    def data_dir(self) -> Path:
        return self.home / ".local" / "share" / "runfleet" / "dev"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in URL_VARS}
        env["HOME"] = str(self.home)
        env["PYTHONPATH"] = os.pathsep.join([str(self.app), str(ROOT)])
        return env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runfleet.ops", *args],
            cwd=self.app, env=self.env(), capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def start(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with (self.app / log).open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *args], cwd=self.app, env=self.env(),
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.started.append(proc)
        return proc

    def worker(self, log: str = "worker.log") -> subprocess.Popen[bytes]:
        return self.start("-m", "runfleet.ops", "worker", "--flows", "tasks", log=log)

    def produce(self, run_id: str) -> tuple[float, str, str]:
        """Seconds from the producer's start to its printed result; its stdout, stderr."""
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "produce.py", run_id], cwd=self.app, env=self.env(),
            capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return time.monotonic() - began, done.stdout, done.stderr

    def stop_processes(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.started.clear()

    def close(self) -> None:
        """Stop the app's processes, then the pair (never left running after a test)."""
        self.stop_processes()
        self.cli("dev", "stop")
        shutil.rmtree(self.home, ignore_errors=True)


def fresh_home() -> Path:
    """An empty HOME directly under the temp dir, not under pytest's ``tmp_path``: as root
    the embedded Postgres runs as ``nobody`` and must traverse every folder above its data,
    and each new pytest session on the machine makes ``/tmp/pytest-of-<user>`` 0700 again,
    which would lock a running server out of its own files."""
    return Path(tempfile.mkdtemp(prefix="rf-home-"))
