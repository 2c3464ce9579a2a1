"""scripts/namespace.py: every form it rewrites, what it leaves alone, and a second run.

The lead replays the script on each branch before merging it, so its output must be
exactly this, and running it on its own output must change nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "namespace.py"

BEFORE = {
    "store/__init__.py": "from store.db import Store\n",
    "store/db.py": "class Store: ...\n",
    "store/sql/__init__.py": "",
    "broker/__init__.py": "from broker.queue import Queue\n",
    "broker/queue.py": "class Queue: ...\n",
    "broker/streams.py": "PUBLISH_CHUNK = 1\n",
    "worker/__init__.py": "",
    "worker/driver.py": "def drive() -> None: ...\n",
    "ops/__init__.py": "",
    "ops/demo/__init__.py": "",
    "ops/demo/flows.py": "",
    "ops/cli/__init__.py": "",
    "ops/cli/app.py": "app = None\n",
    "app.py": '''"""Docstrings keep store.db as prose."""

import sys
from importlib import resources

import broker  # beside broker.streams: the names say runfleet.broker
import broker.streams
import worker.driver as drive_module
from ops.demo import flows
from store import Store
from store.db import Store as S2

if sys:
    from worker import driver  # worker.driver, in a comment, stays

TARGET = "worker.driver.drive"
EVENT = "worker.started"  # a log event: no module worker/started.py
PATH = "store/db.py"
ARGV = [sys.executable, "-m", "ops", "worker", "--flows", "ops.demo.flows"]
SQL = resources.files("store")
CHUNK = broker.streams.PUBLISH_CHUNK
QUEUE = broker.Queue
''',
    "solo.py": "import broker\n\nQUEUE = broker.Queue\n",
    "Makefile": "demo:\n\tpython -m ops.demo\n",
    "compose.yaml": "command: [runfleet, worker, --flows, ops.demo.flows]\n",
    "guide.md": "```python\nfrom broker import Queue\nimport worker\n```\nSee `store.db.Store`.\n",
    "pyproject.toml": """[project.scripts]
runfleet = "ops.cli.app:app"

[tool.setuptools.packages.find]
include = ["store*", "broker*", "worker*", "ops*"]

[tool.setuptools.package-data]
store = ["sql/*.sql"]

[tool.mypy]
packages = ["store", "broker", "worker", "ops", "tests"]
""",
}

AFTER = {
    "app.py": '''"""Docstrings keep store.db as prose."""

import sys
from importlib import resources

import runfleet.broker  # beside broker.streams: the names say runfleet.broker
import runfleet.broker.streams
import runfleet.worker.driver as drive_module
from runfleet.ops.demo import flows
from runfleet.store import Store
from runfleet.store.db import Store as S2

if sys:
    from runfleet.worker import driver  # worker.driver, in a comment, stays

TARGET = "runfleet.worker.driver.drive"
EVENT = "worker.started"  # a log event: no module worker/started.py
PATH = "store/db.py"
ARGV = [sys.executable, "-m", "runfleet.ops", "worker", "--flows", "runfleet.ops.demo.flows"]
SQL = resources.files("runfleet.store")
CHUNK = runfleet.broker.streams.PUBLISH_CHUNK
QUEUE = runfleet.broker.Queue
''',
    "solo.py": "from runfleet import broker\n\nQUEUE = broker.Queue\n",
    "Makefile": "demo:\n\tpython -m runfleet.ops.demo\n",
    "compose.yaml": "command: [runfleet, worker, --flows, runfleet.ops.demo.flows]\n",
    "guide.md": (
        "```python\nfrom runfleet.broker import Queue\nfrom runfleet import worker\n```\n"
        "See `runfleet.store.db.Store`.\n"
    ),
    "pyproject.toml": """[project.scripts]
runfleet = "runfleet.ops.cli.app:app"

[tool.setuptools.packages.find]
include = ["runfleet*"]

[tool.setuptools.package-data]
"runfleet.store" = ["sql/*.sql"]

[tool.mypy]
packages = ["runfleet", "tests"]
""",
    "store/__init__.py": "from runfleet.store.db import Store\n",
}


def _tree(where: Path) -> None:
    for name, text in BEFORE.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(where)], check=True)


def _script(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, str(where)], capture_output=True, text=True
    )


def test_the_script_rewrites_each_form_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert _script(tmp_path, "--check").returncode == 1
    done = _script(tmp_path)
    assert done.returncode == 0, done.stderr
    for name, text in AFTER.items():
        assert (tmp_path / name).read_text() == text, name
    assert (tmp_path / "store" / "db.py").read_text() == BEFORE["store/db.py"]
    again = _script(tmp_path, "--check")
    assert again.returncode == 0 and again.stdout == "", again.stdout


def test_a_name_it_cannot_rewrite_safely_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / "clash.py").write_text(
        "import broker.streams\n\n\ndef f(broker: int) -> int:\n    return broker\n"
    )
    done = _script(tmp_path)
    assert done.returncode == 2 and "clash.py" in done.stderr, done.stderr
    assert (tmp_path / "app.py").read_text() == BEFORE["app.py"], "nothing is half-written"
