"""What one ``python -m bench fleet`` run measures: a plan, one value with its defaults.

A phase runs when its section is present: ``recovery = None`` skips the SIGKILL recovery,
``scale = ()`` the drain by process count, ``history_rows = 0`` the drain beside a
million settled runs (``without`` and ``--skip`` name them by ``Phase``). The defaults
are the published run; a plan file (TOML or JSON, ``bench/plans/``) or a few
command-line options change it, and the result carries the plan it ran.
"""

from __future__ import annotations

import json
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runfleet.ops.bench.scratch import BenchError

Positive = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(gt=0)]


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Recovery(Section):
    """SIGKILL a worker running long runs on an empty queue; time each re-activation."""

    kills: Positive = 3
    runs: Positive = 50
    """Runs admitted (each napping ``nap_s``) before each kill."""
    nap_s: Seconds = 10.0


class BacklogRecovery(Section):
    """The same kills behind a backlog, with the survivors busy."""

    backlog: Positive = 1000
    kills: Positive = 2
    concurrency: Positive = 8
    """Slots per worker in this phase (fewer than the drain's, so the backlog stays)."""
    nap_ms: tuple[Positive, Positive] = (100, 200)
    """Each backlog run naps between these two bounds."""


class Memory(Section):
    """A worker's resident memory with ``runs`` in flight."""

    runs: Positive = 500


class Results(Section):
    """A producer waiting on every result, and ``wait()`` of settled runs."""

    runs: Positive = 1000
    samples: Positive = 200


class Soak(Section):
    """One worker drains ``runs``, its RSS sampled every 10,000: opt-in, it takes minutes."""

    runs: Positive = 100_000


class Phase(StrEnum):
    """A phase ``--skip`` leaves out (the headline enqueue, drain and idle start always run)."""

    RESULTS = "results"
    RECOVERY = "recovery"
    BACKLOG_RECOVERY = "backlog-recovery"
    MEMORY = "memory"
    SCALE = "scale"
    FSYNC = "fsync"
    HISTORY = "history"
    SOAK = "soak"


class FleetPlan(Section):
    """runfleet beside rq: every figure of one fleet run, and what each phase is given."""

    runs: Positive = 2000
    """Runs per enqueue phase; every drain drains 2 x ``runs``."""
    workers: Positive = 2
    """Worker processes per side."""
    concurrency: Positive = 64
    """Slots per runfleet worker."""
    latency_samples: Positive = 200
    """Idle enqueue -> start samples, ``latency_gap_s`` apart."""
    latency_gap_s: Annotated[float, Field(ge=0)] = 0.02
    scale: tuple[Positive, ...] = (1, 2, 4)
    """Process counts to drain with, each side (``()`` skips)."""
    fsync: bool = True
    """The drain with fsync on and off (two throwaway servers; a given server as found)."""
    history_rows: Annotated[int, Field(ge=0)] = 1_000_000
    """Settled runs (+3 journal records each) before the second history drain (0 skips)."""
    results: Results | None = Results()
    recovery: Recovery | None = Recovery()
    backlog_recovery: BacklogRecovery | None = BacklogRecovery()
    memory: Memory | None = Memory()
    soak: Soak | None = None

    def without(self, phases: frozenset[Phase]) -> FleetPlan:
        """This plan with ``phases`` left out."""
        return self.model_copy(update=dict(_OFF[phase] for phase in phases))

    @classmethod
    def read(cls, path: Path) -> FleetPlan:
        """A plan file: TOML (``.toml``) or JSON; what it leaves out keeps its default, and
        ``skip = [...]`` names phases to leave out (TOML has no null)."""
        try:
            text = path.read_text()
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("a plan is a table of fields")
            skip = frozenset(Phase(name) for name in data.pop("skip", []))
            return cls.model_validate(data).without(skip)
        except (OSError, ValueError, ValidationError) as exc:
            raise BenchError(f"plan {path}: {exc}") from exc


_OFF: dict[Phase, tuple[str, Any]] = {
    Phase.RESULTS: ("results", None),
    Phase.RECOVERY: ("recovery", None),
    Phase.BACKLOG_RECOVERY: ("backlog_recovery", None),
    Phase.MEMORY: ("memory", None),
    Phase.SOAK: ("soak", None),
    Phase.SCALE: ("scale", ()),
    Phase.FSYNC: ("fsync", False),
    Phase.HISTORY: ("history_rows", 0),
}
"""Each phase: the plan's field that holds it, and the value that leaves it out."""
