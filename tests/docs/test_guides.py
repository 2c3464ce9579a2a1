"""The README's quickstart, the tutorial and both migration guides, executed as written.

Each page's blocks run in order in a fresh folder (``tests/docs/pages.py`` says how a page
marks them): with the harness's servers as the URLs (the production path), and, for the
quickstart and the tutorial, also with no URL and a fresh HOME (the embedded pair). A page
that drifts from the code, or a command that no longer works when pasted, fails here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfleet.runtime import embedded
from tests.docs.pages import ROOT, URL_VARS, Reader, Unmarked, blocks
from tests.embedded.support import fresh_home

PAGES = {
    "quickstart": ROOT / "README.md",
    "tutorial": ROOT / "docs" / "tutorial" / "first-fleet.md",
    "rq": ROOT / "docs" / "how-to" / "moving-from-rq.md",
    "celery": ROOT / "docs" / "how-to" / "moving-from-celery.md",
}
EMBEDDED = ("quickstart", "tutorial")
"""The pages that start with the embedded path, also run that way."""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*URL_VARS, "XDG_DATA_HOME")}
    env["HOME"] = str(home.resolve())
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = str(ROOT)
    env.pop("RUNFLEET_ALLOW_IMPORT", None)  # the suite's own allowance is not the reader's
    return env


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """``app`` (the reader's folder) and ``home`` (a HOME outside pytest's tmp_path: see
    ``tests.embedded.support.fresh_home``)."""
    (tmp_path / "app").mkdir()
    home = fresh_home()
    (tmp_path / "home").symlink_to(home)
    try:
        yield tmp_path
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def _following(reader: Reader, page: Path) -> Iterator[Reader]:
    """The reader done with ``page``, its processes still running; its log on failure."""
    try:
        reader.follow(page)
        yield reader
    except BaseException:
        print("\n".join(reader.log))
        raise
    finally:
        reader.close()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_runnable_block_is_run_or_skipped_on_purpose(name: str) -> None:
    try:
        found = blocks(PAGES[name])
    except Unmarked as exc:
        pytest.fail(str(exc))
    assert any(block.action in ("run", "start") for block in found), "nothing of it runs"


@pytest.mark.timeout(400)  # a page's commands, each bounded by COMMAND_TIMEOUT_S
@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_works_as_written_against_real_servers(
    name: str, folder: Path, database_url: str, redis_url: str, redis_prefix: str
) -> None:
    urls = {"RUNFLEET_DATABASE_URL": database_url, "RUNFLEET_REDIS_URL": redis_url}
    env = {**_env(folder / "home"), **urls, "RUNFLEET_REDIS_PREFIX": redis_prefix}
    with _following(Reader(folder / "app", env, "production", urls), PAGES[name]):
        assert not (folder / "home" / ".local" / "share" / "runfleet").exists()


@pytest.mark.timeout(400)
@pytest.mark.skipif(not embedded.installed(), reason="the embedded extra is not installed")
@pytest.mark.parametrize("name", EMBEDDED)
def test_the_page_works_as_written_with_the_embedded_pair(name: str, folder: Path) -> None:
    with _following(Reader(folder / "app", _env(folder / "home"), "embedded", {}), PAGES[name]):
        assert (folder / "home" / ".local" / "share" / "runfleet" / "dev" / "state.json").exists()
