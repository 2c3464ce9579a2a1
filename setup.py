"""What pyproject.toml cannot say: the wheel's subpackages, and the modules it leaves out.

The repository keeps store/, broker/, producer/, rqface/, declaration/, worker/, ops/ and
runtime/ at its top; ``package-dir`` in pyproject.toml maps them to ``runfleet.store`` etc.
Every folder with an ``__init__.py`` under them is a subpackage, found here so that a new one
needs no edit.

The benchmarks that compare runfleet with its peers (rq, DBOS, Celery) are lab equipment:
they run from a checkout (``pip install -e '.[bench]'``), not from an installed runfleet,
and ``runfleet bench fleet|flows|producer`` says so when they are absent
(ops/bench/__main__.py). So are the servers only the test suites start (Patroni, TLS).
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
TOPS = ("store", "broker", "worker", "ops", "runtime", "declaration", "producer", "rqface")
# Checked by tests/packaging/test_wheel.py against the wheel and ops/bench/__main__.py.
LAB = {
    "runfleet.ops.bench": {
        "rq_side",  # the rq peer adapter
        "rq_worker",  # the rq peer's worker class
        "dbos_side",  # the DBOS peer adapter
        "dbos_app",  # the DBOS peer's workflow process
        "result_soak",  # rq's and runfleet's result round trip, side by side
        "fleet_bench",  # `bench fleet`: runfleet beside rq
        "flows_bench",  # `bench flows`: runfleet beside DBOS
        "scaling",  # the drain at N processes, beside rq
        "runfleet_side",  # runfleet's half of those comparisons
        "drain",
        "durability",
        "recovery_bench",
        "producer_bench",  # `bench producer`: runfleet beside rq and DBOS
        "backlog",  # `bench fleet --backlog-depths`: runfleet beside rq and Celery
        "celery_app",  # the Celery peer adapter
        "threads_admission",  # threads sharing one Queue, beside rq's threads
    },
    # The test suites' own servers: a Patroni cluster (tests/ha) and TLS-only Postgres and
    # Redis (tests/tls). The demo and `bench capacity`/`limits` keep the plain throwaways.
    "runfleet.ops.servers": {"patroni", "tls"},
}


def subpackages() -> list[str]:
    found = ["runfleet"]
    for top in TOPS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            found.append(".".join(("runfleet", *init.parent.relative_to(ROOT).parts)))
    return found


class BuildPy(build_py):
    """build_py without the lab modules."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if m[1] not in LAB.get(package, set())]


setup(packages=subpackages(), cmdclass={"build_py": BuildPy})
