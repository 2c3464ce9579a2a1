"""Reading what happened: the side-effect ledger against the journal's ownership record.

The journal says who owned a run when (every activation is a record carrying the
database time, ``runfleet.now_ms()``, i.e. ``clock_timestamp()``); the ledger says who
*acted* when (``time.time()`` in the worker). Both clocks are this machine's clock, so
they compare directly, up to ``EPSILON_MS`` for the gap between a statement's timestamp
and the moment its answer reaches the process.

An *overlap* is a ledger line written by a process after another owner activated the
run (a steal, or a claim after a release) and before the writer itself activated it
again: a side effect by an old owner after the takeover.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runfleet.store.types import JournalRecord
from tests.partition.hosts import owner_host_pid

EPSILON_MS = 50.0
"""Slack between a statement's database timestamp and the process acting on its answer."""

ACTIVATIONS = frozenset({"claimed-and-activated", "activated", "stolen-and-activated"})
STARTS = frozenset({"start", "body"})
EVERYTHING = frozenset({"start", "body", "end"})


@dataclass(frozen=True)
class Line:
    run: str
    phase: str  # body | start | end
    step: int
    host: str
    pid: int
    t_ms: float
    mode: str

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid} {self.phase} s{self.step} ({self.mode})"


@dataclass(frozen=True)
class Activation:
    at_ms: int
    kind: str
    host: str
    pid: int
    previous: tuple[str, int] | None  # for a steal: whom it was taken from


@dataclass(frozen=True)
class Overlap:
    line: Line
    taken_at_ms: int
    kind: str  # the record that took the run: stolen-and-activated, claimed-and-activated...
    by: tuple[str, int]

    @property
    def late_ms(self) -> float:
        return self.line.t_ms - self.taken_at_ms

    def __str__(self) -> str:
        return (
            f"run {self.line.run[:8]}: {self.line} at T+{self.late_ms:.0f} ms "
            f"after {self.kind} by {self.by[0]} pid {self.by[1]}"
        )


def read_ledger(path: Path) -> list[Line]:
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        data = json.loads(raw)
        lines.append(
            Line(
                run=data["run"],
                phase=data["phase"],
                step=int(data["step"]),
                host=data["host"],
                pid=int(data["pid"]),
                t_ms=float(data["t_ms"]),
                mode=data["mode"],
            )
        )
    return lines


def activations(records: Iterable[JournalRecord]) -> list[Activation]:
    found = []
    for record in records:
        if record.kind not in ACTIVATIONS:
            continue
        host, pid = owner_host_pid(record.source_id)
        previous = None
        if record.kind == "stolen-and-activated" and isinstance(record.payload, dict):
            previous = owner_host_pid(str(record.payload["previous_owner"]))
        found.append(Activation(record.at_ms, record.kind, host, pid, previous))
    return sorted(found, key=lambda a: a.at_ms)


def overlaps(
    lines: Sequence[Line],
    journals: Mapping[str, Sequence[JournalRecord]],
    phases: frozenset[str] = STARTS,
) -> list[Overlap]:
    """Every ledger line (of ``phases``) written by an old owner after a takeover."""
    found = []
    tenures = {run: activations(records) for run, records in journals.items()}
    for line in lines:
        if line.phase not in phases or line.run not in tenures:
            continue
        mine = (line.host, line.pid)
        history = tenures[line.run]
        own = [a for a in history if (a.host, a.pid) == mine and a.at_ms <= line.t_ms + EPSILON_MS]
        since = own[-1].at_ms if own else None
        for later in history:
            if since is not None and later.at_ms <= since:
                continue
            if (later.host, later.pid) == mine:
                break
            if line.t_ms > later.at_ms + EPSILON_MS:
                found.append(Overlap(line, later.at_ms, later.kind, (later.host, later.pid)))
            break
    return found


def beyond_stop_window(found: Sequence[Overlap]) -> list[Overlap]:
    """Overlaps a frozen (SIGSTOPped) process is not allowed even in its documented window.

    A process frozen across the takeover may, when thawed, finish the one thing it was
    doing before its next durable call sees the lost fence: the step in flight (its
    ``start`` and/or ``end`` line), or the body code up to the next durable call (one
    ``body`` line). Anything more per run means it went through a durable call after T.
    """
    by_run: dict[tuple[str, str, int], list[Overlap]] = defaultdict(list)
    for overlap in found:
        by_run[(overlap.line.run, overlap.line.host, overlap.line.pid)].append(overlap)
    excess = []
    for items in by_run.values():
        steps = {o.line.step for o in items if o.line.phase != "body"}
        bodies = [o for o in items if o.line.phase == "body"]
        phases = [o.line.phase for o in items if o.line.phase != "body"]
        one_step = len(steps) <= 1 and len(phases) == len(set(phases)) and not bodies
        one_body = len(bodies) == 1 and not steps
        if not (one_step or one_body):
            excess.extend(items)
    return excess


@dataclass
class Verdict:
    """Named property checks of one scenario, all evaluated before anything is asserted."""

    scenario: str
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append((name, ok, detail))

    def figure(self, text: str) -> None:
        self.figures.append(text)

    @property
    def failed(self) -> list[str]:
        return [name for name, ok, _ in self.checks if not ok]

    def report(self) -> str:
        out = [f"== partition scenario: {self.scenario}"]
        out += [f"   {line}" for line in self.figures]
        for name, ok, detail in self.checks:
            out.append(
                f"   [{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else "")
            )
        return "\n".join(out)
