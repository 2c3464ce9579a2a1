"""What pyproject.toml cannot say: the wheel's subpackages.

The repository keeps store/, broker/, producer/, rqface/, declaration/, worker/, ops/ and
runtime/ at its top; ``package-dir`` in pyproject.toml maps them to ``runfleet.store`` etc.
Every folder with an ``__init__.py`` under them is a subpackage, found here so that a new one
needs no edit. The benchmarks beside runfleet's peers (bench/) and the servers only the test
suites start (tests/servers/) are folders of the checkout beside these, never in the wheel.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
TOPS = ("store", "broker", "worker", "ops", "runtime", "declaration", "producer", "rqface")


def subpackages() -> list[str]:
    found = ["runfleet"]
    for top in TOPS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            found.append(".".join(("runfleet", *init.parent.relative_to(ROOT).parts)))
    return found


setup(packages=subpackages())
