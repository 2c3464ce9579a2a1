"""A checkout resolves ``runfleet.*`` to its own folders, editable install or PYTHONPATH.

The team works in git worktrees with ``PYTHONPATH=<worktree> pytest`` while the shared
venv holds an editable install of another checkout: the worktree's ``store/`` must win.
And ``runfleet`` must never hand out anything but its own subpackages: not the
checkout's ``tests``, not a site-packages package such as PyPI's ``ops``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.packaging.test_wheel import WHEELHOUSE, _fetch, _run

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("store", "broker", "worker", "ops", "runtime", "declaration", "producer", "rqface")

FIND = """
import importlib.util, json, sys
found = {}
for name in ("runfleet", "runfleet.store", "runfleet.broker", "runfleet.worker",
             "runfleet.ops", "runfleet.runtime", "runfleet.declaration",
             "runfleet.producer", "runfleet.rqface", "runfleet.ops.bench.store_bench",
             "runfleet.bench",
             "runfleet.tests", "runfleet.pip",
             "runfleet.scripts", "store", "broker", "worker"):
    spec = importlib.util.find_spec(name)
    found[name] = spec.origin if spec and spec.origin else None
print(json.dumps(found))
"""


def _found(python: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, str | None]:
    done = _run([python, "-c", FIND], cwd=cwd, env=env)
    found: dict[str, str | None] = json.loads(done.stdout)
    return found


def _assert_checkout(found: dict[str, str | None], checkout: Path) -> None:
    assert found["runfleet"] == str(checkout / "runfleet" / "__init__.py"), found
    for top in TOPS:
        origin = found[f"runfleet.{top}"]
        assert origin is not None, top
        # The symlink's path, which is the checkout's folder.
        assert Path(origin).resolve() == (checkout / top / "__init__.py").resolve(), found
    # The operator's own benchmarks are runfleet's; the peer benchmarks (bench/) and the
    # test suites are the checkout's, never runfleet.*.
    assert found["runfleet.ops.bench.store_bench"] is not None
    assert found["runfleet.bench"] is None
    assert found["runfleet.tests"] is None and found["runfleet.pip"] is None
    assert found["runfleet.scripts"] is None


def test_the_checkout_on_pythonpath_wins(tmp_path: Path) -> None:
    """A worktree on PYTHONPATH, whatever the interpreter has installed."""
    other = tmp_path / "worktree"
    _run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(other)])
    _run(["git", "-C", str(other), "checkout", "-q", "HEAD"])
    # The clone has the last commit (symlinks included: git keeps them as links).
    found = _found(sys.executable, tmp_path, env={"PYTHONPATH": str(other)})
    _assert_checkout(found, other)


def test_the_editable_install_resolves_the_checkout(tmp_path: Path) -> None:
    """``pip install -e .`` (what the Makefile does) maps runfleet.* to this checkout."""
    venv = tmp_path / "venv"
    backend = ["setuptools>=77"]
    _fetch(*backend)
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    # --no-deps: the editable finder is what is checked; nothing is imported but runfleet.
    _run(
        [python, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "-e", str(ROOT)],
        env=offline,
    )
    found = _found(python, tmp_path)
    _assert_checkout(found, ROOT)
    assert found["store"] is None and found["broker"] is None and found["worker"] is None
    # Beside it, a worktree on PYTHONPATH still wins over the editable install.
    other = tmp_path / "worktree"
    _run(["git", "clone", "-q", str(ROOT), str(other)])
    _assert_checkout(_found(python, tmp_path, env={"PYTHONPATH": str(other)}), other)
    done = subprocess.run([python, "-c", "import store"], capture_output=True, cwd=tmp_path)
    assert done.returncode != 0
