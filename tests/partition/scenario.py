"""One partition scenario, end to end: a fleet on two hosts, a cut, a heal, the verdict.

Host A (2 processes x 6 slots) has room to spare, host B (2 x 2) is the one partitioned
or frozen. Runs are admitted one by one until B holds several (at most A's slot count in
all), so that A has a free slot for every run B holds when B drops out: the partition ->
takeover time then measures the ownership protocol, not a queue (recovery behind a
backlog and busy survivors has its own test). Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

import tests.partition.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store.types import JournalRecord, RunStatus
from tests.partition.cluster import A_SLOTS, VICTIM, Cluster, now_ms
from tests.partition.evidence import (
    EPSILON_MS,
    EVERYTHING,
    STARTS,
    Overlap,
    Verdict,
    activations,
    beyond_stop_window,
    overlaps,
    read_ledger,
)
from tests.partition.hosts import owner_host_pid
from tests.partition.net import Service
from tests.support.polling import until

MIN_ON_VICTIM = 3
MAX_FIRST_BATCH = A_SLOTS
LOAD_TIMEOUT = 20.0
SETTLE_TIMEOUT = 40.0
REJOIN_TIMEOUT = 20.0
"""With the hold (<= 11 s), every wait together stays under the 150 s test timeout."""
SUPERVISOR_POLL_MS = 250.0
TAKEOVER_SLACK = 3.0
"""Partition -> takeover may take at most stale_after + this (sweep tick, probe, steal)."""


class Steals(StrEnum):
    MUST = "must"  # B's runs must move to A
    NEVER = "never"  # not one stolen-and-activated record may exist


@dataclass(frozen=True)
class Plan:
    name: str
    steals: Steals
    cut: Mapping[str, tuple[Service, ...]] = field(default_factory=dict)
    freeze: bool = False  # SIGSTOP every process of host B instead of cutting links
    steps: int = 8
    step_ms: int = 300
    strict: bool = True
    """No ledger line at all by an old owner after T; False: no step or body *start*."""
    lapse_first: bool = False  # B logs lease.lapsed (or is gone) before its runs are taken


async def run_scenario(cluster: Cluster, plan: Plan) -> Verdict:
    """Drive ``plan`` and judge it; raises only on a harness failure, never on a verdict."""
    verdict = Verdict(plan.name)
    settings = cluster.settings
    victim = cluster.hosts[VICTIM]
    began = time.monotonic()
    async with AsyncQueue("default", settings=settings) as queue:
        first = await _load_victim(cluster, queue, plan)
        on_victim = await _steps_in_flight(cluster, first)
        cut_ms = now_ms()
        if plan.freeze:
            victim.freeze()
        for host, services in plan.cut.items():
            cluster.topo.cut(host, *services)
        modes = {line.run: line.mode for line in read_ledger(cluster.ledger)}
        sync = sum(modes.get(run) == "sync" for run in on_victim)
        verdict.figure(
            f"{len(first)} runs, {len(on_victim)} on host B at the cut (sync steps: {sync}, "
            f"async: {len(on_victim) - sync}); {plan.steps} steps x {plan.step_ms} ms"
        )
        try:
            await _hold(cluster, plan, on_victim, cut_ms)
        finally:
            heal_ms = now_ms()
            cluster.topo.heal()
            if plan.freeze:
                victim.thaw()
        verdict.figure(f"partition held {(heal_ms - cut_ms) / 1000:.1f} s")
        settled_first = await _settle(cluster, first)
        second, rejoin_s = await _rejoin(cluster, queue, heal_ms)
        settled_second = await _settle(cluster, second)
    verdict.figure(f"scenario ran {time.monotonic() - began:.1f} s")
    await _judge(cluster, plan, verdict, first, second, on_victim, cut_ms)
    verdict.check("0 runs lost (first batch settled)", settled_first, f"{len(first)} runs")
    verdict.check(
        "host B takes work again after the heal",
        rejoin_s is not None,
        f"first activation by B {rejoin_s:.1f} s after the heal"
        if rejoin_s is not None
        else "none",
    )
    verdict.check("0 runs lost (after the heal)", settled_second, f"{len(second)} runs")
    return verdict


async def _load_victim(cluster: Cluster, queue: AsyncQueue, plan: Plan) -> list[str]:
    """Admit runs one at a time (sync and async bodies alternating) until B holds some."""
    runs: list[str] = []
    deadline = time.monotonic() + LOAD_TIMEOUT
    while len(runs) < MAX_FIRST_BATCH and time.monotonic() < deadline:
        sync = len(runs) % 2 == 1
        run = await queue.enqueue(
            flows.ledgered, str(cluster.ledger), plan.steps, plan.step_ms, sync
        )
        runs.append(run.id)
        try:
            wait = max(0.1, min(5.0, deadline - time.monotonic()))
            await until(partial(_running, cluster, run.id), wait, f"run {run.id} to start")
        except TimeoutError:
            pass
        if len(await cluster.owned_by(VICTIM, runs)) >= MIN_ON_VICTIM:
            break
    if not await cluster.owned_by(VICTIM, runs):
        raise TimeoutError(
            f"host B took none of {len(runs)} runs:\n{cluster.hosts[VICTIM].text()[-3000:]}"
        )
    return runs


async def _running(cluster: Cluster, run_id: str) -> bool:
    row = await cluster.store.runs.get(run_id)
    return row is not None and row.status is not RunStatus.PENDING


async def _steps_in_flight(cluster: Cluster, run_ids: Sequence[str]) -> list[str]:
    """B's runs, once every one of them is inside a step (its last ledger line a ``start``).

    A run that finishes meanwhile drops out; B must still hold at least one.
    """

    async def check() -> list[str] | None:
        held = await cluster.owned_by(VICTIM, run_ids)
        if not held:
            raise TimeoutError("host B finished its runs before it could be cut off")
        last: dict[str, str] = {}
        for line in read_ledger(cluster.ledger):
            if line.host == f"host-{VICTIM}":
                last[line.run] = line.phase
        return held if all(last.get(run) == "start" for run in held) else None

    held = await until(check, 10, "host B's runs to be inside a step")
    assert isinstance(held, list)
    return [str(run) for run in held]


async def _steals_from_victim(cluster: Cluster) -> dict[str, int]:
    """run -> database time T of the record that stole it from host B."""
    found: dict[str, int] = {}
    for record in await cluster.store.stats.records_of_kind("stolen-and-activated"):
        assert isinstance(record.payload, dict)
        host, _ = owner_host_pid(str(record.payload["previous_owner"]))
        if host == f"host-{VICTIM}":
            found.setdefault(record.run_id, record.at_ms)
    return found


async def _hold(cluster: Cluster, plan: Plan, on_victim: Sequence[str], cut_ms: float) -> None:
    """Keep the partition long enough for a wrong steal or a late side effect to show."""
    stale = cluster.settings.stale_after
    minimum = max(stale + TAKEOVER_SLACK, plan.step_ms / 1000 + 1.0)
    deadline = time.monotonic() + stale + TAKEOVER_SLACK + 5.0
    while time.monotonic() < deadline:
        held = (now_ms() - cut_ms) / 1000
        if plan.steals is Steals.MUST:
            taken = await _steals_from_victim(cluster)
            moved = all(run in taken for run in on_victim)
            if moved and held >= minimum and now_ms() > max(taken.values()) + 1000:
                return
        elif held >= minimum:
            return
        await asyncio.sleep(0.1)


async def _settle(cluster: Cluster, run_ids: Sequence[str]) -> bool:
    try:
        await until(
            lambda: cluster.settled(run_ids), SETTLE_TIMEOUT, f"{len(run_ids)} runs to settle"
        )
    except TimeoutError:
        return False
    return True


async def _rejoin(
    cluster: Cluster, queue: AsyncQueue, heal_ms: float
) -> tuple[list[str], float | None]:
    """Admit short runs in waves until one is activated on host B (or the deadline)."""
    runs: list[str] = []
    deadline = time.monotonic() + REJOIN_TIMEOUT
    while time.monotonic() < deadline:
        for i in range(4):
            run = await queue.enqueue(flows.ledgered, str(cluster.ledger), 2, 200, i % 2 == 1)
            runs.append(run.id)
        await asyncio.sleep(0.5)
        if cluster.hosts[VICTIM].proc.poll() is not None:
            break  # B's `runfleet worker` itself is gone: nothing there can take work
        on_b = [
            a.at_ms
            for records in (await cluster.journals(runs)).values()
            for a in activations(records)
            if a.host == f"host-{VICTIM}"
        ]
        if on_b:
            return runs, (min(on_b) - heal_ms) / 1000
    return runs, None


async def _judge(
    cluster: Cluster,
    plan: Plan,
    verdict: Verdict,
    first: Sequence[str],
    second: Sequence[str],
    on_victim: Sequence[str],
    cut_ms: float,
) -> None:
    everything = [*first, *second]
    journals = await cluster.journals(everything)
    lines = read_ledger(cluster.ledger)
    steals = await cluster.store.stats.records_of_kind("stolen-and-activated")
    taken = await _steals_from_victim(cluster)
    evidence = sorted({str(r.payload.get("probe")) for r in steals if isinstance(r.payload, dict)})
    verdict.figure(f"steals: {len(steals)} (probe evidence: {', '.join(evidence) or '-'})")
    if taken:
        times = sorted((t - cut_ms) / 1000 for t in taken.values())
        verdict.figure(f"partition -> takeover: first {times[0]:.2f} s, last {times[-1]:.2f} s")
    _victim_log_figures(cluster, verdict, cut_ms)

    stale = cluster.settings.stale_after
    if plan.steals is Steals.NEVER:
        verdict.check(
            "0 steals (Redis never decides a steal against an owner that reaches Postgres)",
            not steals,
            "; ".join(f"{r.run_id[:8]} {r.payload}" for r in steals[:3]),
        )
        # The window a wrong steal or lapse needs was really open: B's runs lasted past it.
        past = cut_ms + (stale + 1) * 1000
        stopped = [
            run[:8]
            for run in on_victim
            if not any(
                line.run == run and line.host == f"host-{VICTIM}" and line.phase == "start"
                and line.t_ms > past
                for line in lines
            )
        ]  # fmt: skip
        verdict.check(
            "B keeps executing its runs through the Redis cut (a step start on B after "
            "cut + stale_after + 1 s, for every run B held)",
            not stopped,
            f"stopped early: {stopped}" if stopped else "",
        )
    else:
        missing = [run for run in on_victim if run not in taken]
        verdict.check(
            "every run on B at the cut was taken over", not missing, f"not taken: {missing}"
        )
        late = {
            run: (t - cut_ms) / 1000
            for run, t in taken.items()
            if (t - cut_ms) / 1000 > stale + TAKEOVER_SLACK
        }
        verdict.check(
            f"partition -> takeover <= stale_after + {TAKEOVER_SLACK:.0f} s",
            bool(taken) and not late,
            f"late: { {k[:8]: round(v, 2) for k, v in late.items()} }" if late else "",
        )

    phases = EVERYTHING if (plan.strict or plan.freeze) else STARTS
    found = overlaps(lines, journals, phases)
    after_any = overlaps(lines, journals, EVERYTHING)
    verdict.figure(
        f"ledger: {len(lines)} lines; lines by an old owner after a takeover: "
        f"{len(after_any)} ({_by_phase(after_any)})"
    )
    what = "no ledger line at all" if plan.strict else "no step or body start"
    if plan.freeze:
        excess = beyond_stop_window(found)
        verdict.check(
            "a thawed owner writes at most its one step in flight / one body stretch after T "
            f"(T + {EPSILON_MS:.0f} ms)",
            not excess,
            _list(excess),
        )
    else:
        verdict.check(
            f"0 side effects by an old owner after the takeover: {what} after "
            f"T + {EPSILON_MS:.0f} ms",
            not found,
            _list(found),
        )
    if plan.lapse_first:
        _check_lapse_first(cluster, verdict, journals)

    twice = await cluster.store.stats.settled_more_than_once()
    terminal = {
        run: sum(1 for r in records if r.kind == "transitioned" and isinstance(r.payload, dict)
                 and r.payload.get("to") in ("completed", "failed", "cancelled"))
        for run, records in journals.items()
    }  # fmt: skip
    not_once = {run[:8]: n for run, n in terminal.items() if n != 1}
    verdict.check("0 settled twice (one settlement record per run)", not twice and not not_once,
                  f"{twice or ''} {not_once or ''}".strip())  # fmt: skip
    rows = await cluster.store.runs.get_many(everything)
    failed = {r.id[:8]: r.status.value for r in rows if r.status is not RunStatus.COMPLETED}
    verdict.check("every run completed", not failed, str(failed) if failed else "")


def _check_lapse_first(
    cluster: Cluster, verdict: Verdict, journals: Mapping[str, Sequence[JournalRecord]]
) -> None:
    """The cut-off owner stopped its runs (lease.lapsed) before anyone took them over."""
    victim = cluster.hosts[VICTIM]
    lapsed: dict[tuple[str, int], float] = {}
    for event in victim.events("lease.lapsed"):
        key = owner_host_pid(str(event.fields.get("owner")))
        lapsed.setdefault(key, event.ms)
    # A process that exited (fail-stop) stopped its runs too; the supervisor notices a
    # death within its 0.2 s poll, hence the extra slack on that evidence.
    died: dict[int, float] = {}
    for event in victim.events("supervisor.child_died"):
        died.setdefault(int(event.fields.get("pid") or 0), event.ms)
    bad = []
    for run, records in journals.items():
        for a in activations(records):
            if (
                a.kind != "stolen-and-activated"
                or a.previous is None
                or a.previous[0] != f"host-{VICTIM}"
            ):
                continue
            stopped = lapsed.get(a.previous)
            exited = died.get(a.previous[1], float("inf")) <= a.at_ms + SUPERVISOR_POLL_MS
            if (stopped is None or stopped > a.at_ms + EPSILON_MS) and not exited:
                when = "never" if stopped is None else f"T+{stopped - a.at_ms:.0f} ms"
                bad.append(f"{run[:8]} from pid {a.previous[1]}: lease.lapsed {when}")
    verdict.check(
        "the cut-off owner stops its runs before the takeover (lease.lapsed or exit <= T)",
        not bad,
        "; ".join(bad[:4]),
    )


def _victim_log_figures(cluster: Cluster, verdict: Verdict, cut_ms: float) -> None:
    victim = cluster.hosts[VICTIM]
    interesting = ("lease.lapsed", "lease.reconfirmed", "run.fence_lost", "supervisor.child_died",
                   "worker.failstop", "watchdog.failstop", "run.released")  # fmt: skip
    seen: dict[str, list[float]] = {}
    for event in victim.events():
        if event.name in interesting or "failstop" in event.name or "watchdog" in event.name:
            seen.setdefault(event.name, []).append((event.ms - cut_ms) / 1000)
    parts = [f"{name} x{len(ts)} (first at cut{ts[0]:+.2f} s)" for name, ts in sorted(seen.items())]
    verdict.figure("host B log: " + ("; ".join(parts) or "no lapse/fence/exit events"))
    status = victim.proc.poll()
    if status is not None:
        verdict.figure(
            f"host B's `runfleet worker --processes 2` itself EXITED with status {status}"
        )


def _by_phase(found: Sequence[Overlap]) -> str:
    counts: dict[str, int] = {}
    for o in found:
        counts[f"{o.line.phase}/{o.line.mode}"] = counts.get(f"{o.line.phase}/{o.line.mode}", 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def _list(found: Sequence[Overlap]) -> str:
    shown = "; ".join(str(o) for o in found[:5])
    return shown + (f" (+{len(found) - 5} more)" if len(found) > 5 else "")
