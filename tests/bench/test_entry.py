"""``runfleet bench fleet|backlog|flows|producer``: a checkout's bench/, or how to get it.

The peer benchmarks are not runfleet's: the product's ``bench`` group runs a checkout's
bench/ folder when runfleet runs from one, and anywhere else names the checkout and the
command, exiting 2 (tests/packaging/test_wheel.py runs that from the installed wheel).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.plan import FleetPlan
from runfleet.ops.bench import __main__ as entry


def test_in_a_checkout_the_entry_runs_bench() -> None:
    done = CliRunner().invoke(entry.app, ["fleet", "--runs", "7", "--show-plan"])
    assert done.exit_code == 0, done.output
    assert FleetPlan.model_validate_json(done.stdout) == FleetPlan(runs=7)


@pytest.mark.parametrize("command", sorted(entry.PEERS))
def test_without_a_checkout_the_entry_says_how_and_exits_2(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(entry, "ROOT", tmp_path)  # a runfleet with no bench/ beside it
    done = CliRunner().invoke(entry.app, [command, "--runs", "5"])
    assert done.exit_code == 2
    assert f"python -m bench {command} --help" in done.output
    assert "pip install -e '.[dev,bench]'" in done.output
