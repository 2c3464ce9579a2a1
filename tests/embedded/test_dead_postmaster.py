"""A postmaster killed behind runfleet's back can linger as a zombie until its parent (the
init process, after pg_ctl exits) reaps it, and a new postmaster refuses a data directory
whose ``postmaster.pid`` names a pid that still exists. The start waits for such a pid to
go, and only for a dead one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from runfleet.runtime import embedded


def _data_dir(tmp_path: Path, pid: int) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "postmaster.pid").write_text(f"{pid}\n{data}\n0\n5432\n")
    return data


def test_a_dead_unreaped_postmaster_is_waited_for_until_it_is_reaped(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    deadline = time.monotonic() + 10
    while not embedded._is_zombie(child.pid):  # dead, its status not collected: a zombie
        assert time.monotonic() < deadline, "the killed child never became a zombie"
        time.sleep(0.01)
    data = _data_dir(tmp_path, child.pid)
    reaper = threading.Timer(0.4, child.wait)  # its parent collects it later, as init does
    reaper.start()
    began = time.monotonic()
    embedded._wait_for_dead_postmaster(data, timeout=10)
    waited = time.monotonic() - began
    reaper.join()
    assert 0.35 <= waited < 5, waited
    assert not embedded._is_zombie(child.pid)


def test_a_live_process_under_the_pid_and_no_pid_file_are_not_waited_for(
    tmp_path: Path,
) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        began = time.monotonic()
        embedded._wait_for_dead_postmaster(_data_dir(tmp_path, live.pid), timeout=10)
        embedded._wait_for_dead_postmaster(tmp_path / "no-such-data", timeout=10)
        assert time.monotonic() - began < 1
    finally:
        live.kill()
        live.wait()
