"""docs/how-to/moving-from-celery.md's "Chain and group", as written: its module, its worker
command and its producer script, in a fresh folder, with a real worker process."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from runfleet.store.config import Settings
from tests.fleet.procs import ROOT, settings_env

PAGE = ROOT / "docs" / "how-to" / "moving-from-celery.md"


def _blocks() -> list[tuple[str, str]]:
    section = PAGE.read_text().split("\n## Chain and group\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def test_chain_group_and_chord_as_written(settings: Settings, tmp_path: Path) -> None:
    (module, command, producer) = _blocks()
    assert module[0] == "python" and command[0] == "sh" and producer[0] == "python"
    for _lang, code in (module, producer):
        path = tmp_path / code.splitlines()[0].removeprefix("# ").strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    env = settings_env(settings)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    args = shlex.split(command[1].strip())
    assert args[0] == "runfleet"
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "runfleet", *args[1:]],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 45
        while "worker.started" not in (tmp_path / "worker.log").read_text(errors="replace"):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
        done = subprocess.run(
            [sys.executable, "produce.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        log.close()
    assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()
    promised = re.search(r"It prints `(.*?)`, then `(.*?)`,\nthen `(.*?)`\.", PAGE.read_text())
    assert promised is not None, "the page says what the script prints"
    assert done.stdout.splitlines() == list(promised.groups())
