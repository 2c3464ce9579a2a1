"""The built wheel, installed into a clean venv beside PyPI's ``ops``, is runfleet.

Everything here is real: ``python -m build`` makes the sdist and, from it, the wheel; a
fresh venv gets Canonical's ``ops`` first and then that wheel (never the editable install
or this checkout: the venv's commands run in a temporary directory with no PYTHONPATH);
the console script applies the migrations to a real, empty Postgres database.

Offline-ish: every distribution pip needs (the build backend, runfleet's dependencies,
``ops``) is kept in a wheelhouse (``RUNFLEET_WHEELHOUSE``, default
``~/.cache/runfleet/wheelhouse``). pip downloads into it only what it lacks (the first
run needs the index); the installs and the isolated build then read it with ``--no-index``.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import runfleet
from tests.conftest import NewDatabase

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(
    os.environ.get("RUNFLEET_WHEELHOUSE", Path.home() / ".cache" / "runfleet" / "wheelhouse")
)
TOPS = ("store", "broker", "worker", "ops", "runtime", "declaration", "producer", "rqface")


LAB = (ROOT / "bench", ROOT / "tests" / "servers")
"""The checkout's lab equipment: the benchmarks beside runfleet's peers, and the servers
only the test suites start (a Patroni cluster, TLS-only Postgres and Redis)."""

LAB_IMPORTS = (
    "bench", "bench.fleet_bench", "tests.servers.patroni",
    "runfleet.bench", "runfleet.ops.bench.fleet_bench", "runfleet.ops.bench.rq_side",
    "runfleet.ops.servers.patroni", "runfleet.ops.servers.tls",
)  # fmt: skip
"""Where the lab's modules are, or were once: none of them imports from the wheel."""


def lab_files() -> dict[str, bytes]:
    """Every file of the lab with content (relative path -> bytes), plans included."""
    return {
        str(path.relative_to(ROOT)): path.read_bytes()
        for folder in LAB
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.stat().st_size
    }


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, code: int = 0
) -> subprocess.CompletedProcess[str]:
    """``argv`` without this checkout's PYTHONPATH (and without the shared venv's)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})
    done = subprocess.run(argv, capture_output=True, text=True, env=clean, cwd=cwd, timeout=600)
    assert done.returncode == code, f"{argv}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _fetch(*requirements: str) -> None:
    """Put ``requirements`` (and their dependencies) in the wheelhouse: offline if it has them.

    Under a lock: parallel sessions (xdist workers, two checkouts) share the wheelhouse,
    and one must not install from a wheel another is still writing.
    """
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(WHEELHOUSE)]
    local = ["--no-index", "--find-links", str(WHEELHOUSE)]
    with (WHEELHOUSE / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        offline = subprocess.run([*pip, *local, *requirements], capture_output=True, text=True)
        if offline.returncode != 0:
            _run([*pip, "--find-links", str(WHEELHOUSE), *requirements])


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    backend = ast.literal_eval(
        next(
            line.split("=", 1)[1].strip()
            for line in (ROOT / "pyproject.toml").read_text().splitlines()
            if line.startswith("requires")
        )
    )
    _fetch(*backend)
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], env=offline)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("runfleet-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("venv")
    _fetch("ops", str(wheel))
    for stray in WHEELHOUSE.glob("runfleet-*"):  # pip download copied the wheel itself
        stray.unlink(missing_ok=True)  # or another session removed it first
    _run([sys.executable, "-m", "venv", str(where)])
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    pip += ["--no-index"]
    _run([*pip, "--find-links", str(WHEELHOUSE), "ops"])  # the application's own `ops`
    _run([*pip, "--find-links", str(WHEELHOUSE), str(wheel)])
    yield where


def test_the_wheel_holds_runfleet_only_and_no_lab_equipment(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"runfleet", f"runfleet-{runfleet.__version__}.dist-info"}, tops
    # Nothing of bench/ or tests/servers/ is in it, under any name: no file of the wheel
    # has the content of a lab file, and no module bears a lab module's name.
    lab = lab_files()
    assert len(lab) > 20 and "bench/plans/tiny.toml" in lab, sorted(lab)
    contents = {archive.read(name) for name in names}
    assert not [path for path, body in lab.items() if body in contents]
    stems = {Path(p).name for p in lab if Path(p).suffix == ".py"} - {"__init__.py", "__main__.py"}
    assert not [n for n in names if Path(n).name in stems]
    for needed in (
        "runfleet/py.typed",
        "runfleet/store/schema.sql",
        "runfleet/store/migrations/0001_initial.sql",
        "runfleet/store/sql/runs.sql",
        "runfleet/ops/dashboard/templates/base.html",
        "runfleet/ops/bench/capacity.py",  # what an operator measures on their own servers
        "runfleet/ops/bench/store_bench.py",
        "runfleet/ops/servers/resolve.py",  # the demo's and bench capacity's servers
    ):
        assert needed in names, needed
    # Every subpackage of the checkout is in the wheel (setup.py finds them itself).
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            assert f"runfleet/{init.relative_to(ROOT)}" in names, init


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    (sdist,) = dist.glob("runfleet-*.tar.gz")
    assert sdist.name == f"runfleet-{runfleet.__version__}.tar.gz"


CHECK = """
import importlib.util, json, sys
def there(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is absent
        return False
import ops
import runfleet
from runfleet import AsyncQueue, Job, Queue, Retry, StepRetry, flow
from runfleet.store.migrate import migrations
import runfleet.ops.cli.app
print(json.dumps({
    "ops": ops.__file__, "charm": hasattr(ops, "CharmBase"),
    "runfleet": runfleet.__file__, "inner_ops": runfleet.ops.__name__,
    "tops": [n for n in ("store", "broker", "worker") if importlib.util.find_spec(n)],
    "lab": [m for m in sys.argv[1:] if there(m)],
    "migrations": len(migrations()), "version": runfleet.__version__,
    "all": sorted(runfleet.__all__),
}))
"""


def test_runfleet_and_pypis_ops_both_import_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    python = str(venv / "bin" / "python")
    done = _run([python, "-c", CHECK, *LAB_IMPORTS], cwd=tmp_path)
    found = json.loads(done.stdout)
    assert found["ops"] == str(site / "ops" / "__init__.py") and found["charm"], found
    assert found["runfleet"] == str(site / "runfleet" / "__init__.py"), found
    assert found["inner_ops"] == "runfleet.ops"
    assert found["tops"] == [], "the wheel installed top-level packages besides runfleet"
    assert found["lab"] == []
    assert found["migrations"] == len(list((ROOT / "store" / "migrations").glob("*.sql")))
    assert found["version"] == runfleet.__version__
    assert found["all"] == sorted(runfleet.__all__)


async def test_the_console_script_works_from_the_wheel(
    venv: Path, tmp_path: Path, new_empty_database: NewDatabase
) -> None:
    script = str(venv / "bin" / "runfleet")
    version = _run([script, "--version"], cwd=tmp_path)
    assert version.stdout.strip() == f"runfleet {runfleet.__version__}"
    assert "migrate" in _run([script, "--help"], cwd=tmp_path).stdout
    url = await new_empty_database()
    migrated = _run([script, "migrate", "--database-url", url], cwd=tmp_path)
    assert "migrations applied" in migrated.stdout
    # What a user benchmarks on their own servers is there; a peer benchmark says how to
    # run it from a checkout, instead of a traceback.
    for command in ("store", "capacity", "limits"):
        assert "--json" in _run([script, "bench", command, "--help"], cwd=tmp_path).stdout
    for command in ("fleet", "backlog", "flows", "producer"):
        peer = _run([script, "bench", command, "--runs", "5"], cwd=tmp_path, code=2)
        assert f"python -m bench {command} --help" in peer.stderr, peer.stderr
        assert "pip install -e '.[dev,bench]'" in peer.stderr and "bench/" in peer.stderr
