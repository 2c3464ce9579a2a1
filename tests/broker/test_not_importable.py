"""What no worker could import is refused at enqueue, with a typed error saying what to do.

A function defined in the producer's ``__main__`` (the script being run), a lambda or a
nested function was accepted and then stayed pending for ever: no worker's ``__main__``
is the producer's script. A ``__main__`` run as ``python -m pkg.mod`` is importable by
that name, and its functions are admitted under it. rq's ``is_async=False`` runs in the
producer's own process, so anything goes there.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from runfleet import NotImportable, Queue
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.worker.process import Worker
from tests.fleet.procs import ROOT, settings_env

SCRIPT = """
from runfleet import NotImportable, Queue

def send_welcome(user_id):
    return user_id

with Queue("default") as q:
    try:
        q.enqueue(send_welcome, 42)
    except NotImportable as exc:
        print(f"refused {exc.function}: {exc}")
    with Queue("default", is_async=False) as inline:
        print("inline", inline.enqueue(send_welcome, 7).return_value())
"""


async def test_a_function_of_the_producers_script_is_refused_at_enqueue(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    script = tmp_path / "producer.py"
    script.write_text(SCRIPT)
    done = await _run([sys.executable, str(script)], settings, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    refused, inline = done.stdout.splitlines()
    assert refused.startswith("refused __main__:send_welcome: "), refused
    assert "defined in __main__" in refused and "move it into an importable module" in refused
    assert inline == "inline 7", "in-process (is_async=False) a script's function still runs"
    assert await store.inspect.pending_older(0, limit=10) == [], "nothing was admitted"


def test_lambdas_and_nested_functions_are_refused_by_name(settings: Settings) -> None:
    def nested(n: int) -> int:
        return n

    with Queue("default", settings=settings) as q:
        with pytest.raises(NotImportable, match="is a lambda") as lam:
            q.enqueue(lambda: 1)
        with pytest.raises(NotImportable, match="defined inside another function") as inner:
            q.enqueue(nested, 1)
    assert lam.value.function.endswith("<lambda>")
    assert inner.value.function.endswith("<locals>.nested")
    assert isinstance(inner.value, InvalidInput), "still the InvalidInput callers catch"


async def test_a_main_run_as_a_module_is_admitted_by_its_module_name(
    settings: Settings, store: Store, worker: Worker
) -> None:
    done = await _run([sys.executable, "-m", "tests.broker.main_producer", "21"], settings, ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.strip()
    row = await store.runs.get(run_id)
    assert row is not None and row.flow == "tests.broker.main_producer:double"
    async with AsyncQueue("default", settings=settings) as q:
        assert await q.run(run_id).result(timeout=20) == 42, "a worker imported and ran it"


async def _run(
    command: list[str], settings: Settings, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """A producer process, waited for off the event loop (an in-process worker runs on it)."""
    return await asyncio.to_thread(
        subprocess.run, command, env=settings_env(settings), cwd=cwd, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
