"""A fleet run is one value: ``FleetPlan``, with its defaults, its checks and its files.

No server is needed: a plan is built, read and refused before anything is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.__main__ import app
from bench.plan import BacklogRecovery, FleetPlan, Phase, Results, Soak
from runfleet.ops.bench.scratch import BenchError

PLANS = Path(__file__).resolve().parents[2] / "bench" / "plans"


def _shown(*args: str) -> FleetPlan:
    """The plan ``fleet`` would run with ``args`` (``--show-plan`` measures nothing)."""
    done = CliRunner().invoke(app, ["fleet", *args, "--show-plan"])
    assert done.exit_code == 0, done.output
    return FleetPlan.model_validate_json(done.stdout)


def test_the_defaults_are_the_published_run() -> None:
    plan = FleetPlan()
    assert (plan.runs, plan.workers, plan.concurrency, plan.scale) == (2000, 2, 64, (1, 2, 4))
    assert plan.fsync and plan.history_rows == 1_000_000
    assert plan.results == Results() and plan.backlog_recovery == BacklogRecovery()
    assert plan.soak is None  # opt-in: minutes on its own
    assert _shown() == plan


def test_each_skipped_phase_leaves_its_section_out_and_nothing_else() -> None:
    plan = FleetPlan()
    for phase in Phase:
        left = plan.without(frozenset({phase}))
        changed = {k for k, v in left.model_dump().items() if v != plan.model_dump()[k]}
        assert len(changed) == (0 if phase is Phase.SOAK else 1), (phase, changed)
    everything = plan.without(frozenset(Phase))
    assert everything.results is None and everything.recovery is None
    assert everything.memory is None and everything.backlog_recovery is None
    assert everything.scale == () and not everything.fsync and everything.history_rows == 0


def test_the_command_line_overrides_the_file_then_skips(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"runs": 50, "workers": 3, "soak": {"runs": 10}}))
    plan = _shown("--plan", str(path), "--runs", "70", "--skip", "history,memory")
    assert (plan.runs, plan.workers, plan.soak) == (70, 3, Soak(runs=10))
    assert plan.history_rows == 0 and plan.memory is None and plan.recovery is not None


def test_the_shipped_plan_files_read() -> None:
    tiny = FleetPlan.read(PLANS / "tiny.toml")
    assert tiny.runs == 20 and tiny.scale == (1,) and tiny.soak == Soak(runs=30)
    soak = FleetPlan.read(PLANS / "soak.toml")  # the published run, and its soak
    assert soak == FleetPlan(soak=Soak(runs=100_000))
    assert sorted(p.name for p in PLANS.iterdir()) == ["soak.toml", "tiny.toml"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("runs = 0", "greater than or equal to 1"),
        ("rnus = 10", "rnus"),  # a misspelt field is refused, never ignored
        ("[recovery]\nkills = -1", "kills"),
        ('skip = ["sleep"]', "sleep"),
        ("scale = [1, 0]", "scale"),
    ],
)
def test_a_wrong_plan_is_refused_naming_the_field(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    with pytest.raises(BenchError, match=words):
        FleetPlan.read(path)
    done = CliRunner().invoke(app, ["fleet", "--plan", str(path), "--show-plan"])
    assert done.exit_code == 2 and "--plan" in done.output


def test_a_plan_is_frozen() -> None:
    with pytest.raises(ValueError, match="frozen"):
        FleetPlan().runs = 5
