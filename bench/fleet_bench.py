"""The fleet benchmark: runfleet against rq on the same machine, in one invocation.

Both sides run the same no-op with the same number of worker processes against the same
Redis; runfleet also writes every run to Postgres (row + journal) in a scratch database.
Figures are side by side and the verdicts against rq are ratios (see ``TARGETS``), never
absolute thresholds a slower machine would fail. Then, side by side where rq has an
equivalent: the drain with 1, 2 and 4 processes, with fsync on and off, with 1,000,000
settled runs in the tables (``bench.scaling``), and with a producer waiting on every
result (``bench.result_soak``). Runfleet alone: how soon a SIGKILLed worker's
runs are re-activated elsewhere (database time, kill to each steal) on an empty queue and
behind a 1,000-run backlog with busy survivors (``bench.recovery_bench``), a
worker's resident memory with 500 runs in flight, and (opt-in, the plan's ``soak``) over
100,000 runs. ``bench.plan.FleetPlan`` says which phases run and how large.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from bench import result_soak, rq_side, runfleet_side, scaling
from bench.drain import drop_keys
from bench.figures import percentile
from bench.plan import FleetPlan
from bench.recovery_bench import Recovery, empty_queue, with_backlog
from bench.servers import Servers, bench_prefix
from runfleet.ops.bench.scratch import scratch_database
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate

FLOWS = runfleet_side.FLOWS_MODULE

TARGETS: dict[str, float] = {
    "drain >= 3x rq SimpleWorker": 3.0,
    "enqueue, one call each >= 0.5x rq": 0.5,
    "enqueue_many >= 1x rq": 1.0,
}
"""The ratios against rq the run reports as targets, both sides in one invocation."""


@dataclass(frozen=True, slots=True)
class FleetBenchResult:
    plan: FleetPlan
    rq: rq_side.SideResult
    runfleet: rq_side.SideResult
    recovery: Recovery | None
    memory: result_soak.Memory | None
    load_before: tuple[float, float, float]
    backlog_recovery: Recovery | None = None
    stale_after: float = 5.0
    scale: tuple[scaling.ScaleRow, ...] = ()
    fsync: tuple[scaling.FsyncRow, ...] = ()
    history: scaling.History | None = None
    results: result_soak.Results | None = None
    soak: result_soak.Soak | None = None

    def ratio(self, field: str) -> float:
        mine, theirs = getattr(self.runfleet, field), getattr(self.rq, field)
        return float(mine / theirs) if theirs else float("inf")

    @property
    def drain_ratio(self) -> float:
        """Runfleet's processing-window drain rate over rq's (the headline ratio)."""
        return self.runfleet.drain.window_rate / self.rq.drain.window_rate

    @property
    def drain_wall_ratio(self) -> float:
        return self.runfleet.drain.wall_rate / self.rq.drain.wall_rate

    def targets(self) -> dict[str, tuple[str, bool]]:
        """Each target: (what was measured, met?)."""
        rf = self.runfleet
        measured = {
            "drain >= 3x rq SimpleWorker": self.drain_ratio,
            "enqueue, one call each >= 0.5x rq": self.ratio("enqueue_single_per_s"),
            "enqueue_many >= 1x rq": self.ratio("enqueue_many_per_s"),
        }
        found = {
            name: (f"{measured[name]:.2f}x", measured[name] >= floor)
            for name, floor in TARGETS.items()
        }
        found.update(
            {
                "idle start latency p50 <= 5 ms": (
                    f"{percentile(rf.latency_ms, 50):.1f} ms",
                    percentile(rf.latency_ms, 50) <= 5,
                ),
            }
        )
        found.update(scaling.targets_of(self.scale, self.history))
        if self.recovery is not None:
            p99 = percentile(self.recovery.delays_ms, 99)
            found["SIGKILL recovery p99 <= 7 s"] = (f"{p99 / 1000:.2f} s", p99 <= 7000)
        if self.backlog_recovery is not None:
            p99 = percentile(self.backlog_recovery.delays_ms, 99)
            budget = self.stale_after + 3
            found[f"SIGKILL recovery with backlog p99 <= stale_after + 3 s ({budget:g} s)"] = (
                f"{p99 / 1000:.2f} s",
                p99 <= budget * 1000,
            )
        if self.memory is not None:
            mb = self.memory.loaded_mb
            found[f"worker RSS < 200 MB at {self.memory.concurrency} in flight"] = (
                f"{mb:.0f} MB",
                mb < 200,
            )
        if self.soak is not None:
            soak = self.soak
            found[f"worker RSS flat over {soak.runs:,} runs (growth < 20 MB or < 10%)"] = (
                f"{soak.growth_mb:+.1f} MB",
                soak.flat,
            )
        return found

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": "fleet",
            "plan": self.plan.model_dump(mode="json"),
            "runs": self.plan.runs,
            "workers": self.plan.workers,
            "concurrency": self.plan.concurrency,
            "load_average_before": list(self.load_before),
            "rq": self.rq.as_json(),
            "runfleet": self.runfleet.as_json(),
            "ratios": {
                "enqueue_single": round(self.ratio("enqueue_single_per_s"), 3),
                "enqueue_many": round(self.ratio("enqueue_many_per_s"), 3),
                "drain_window": round(self.drain_ratio, 3),
                "drain_wall": round(self.drain_wall_ratio, 3),
            },
            "recovery": self.recovery.as_json() if self.recovery else None,
            "backlog_recovery": (
                self.backlog_recovery.as_json() if self.backlog_recovery else None
            ),
            "memory": self.memory.as_json() if self.memory else None,
            "scale": [row.as_json() for row in self.scale],
            "fsync": [row.as_json() for row in self.fsync],
            "history": self.history.as_json() if self.history else None,
            "results": self.results.as_json() if self.results else None,
            "soak": self.soak.as_json() if self.soak else None,
            "targets": {k: {"measured": v[0], "met": v[1]} for k, v in self.targets().items()},
        }


async def run(servers: Servers, plan: FleetPlan) -> FleetBenchResult:
    """The whole benchmark as ``plan`` says; scratch databases and Redis keys are removed
    afterwards. Every added drain (processes, fsync, history) drains 2 x ``plan.runs``, as
    the headline does."""
    runs, workers, concurrency = plan.runs, plan.workers, plan.concurrency
    gap_s = plan.latency_gap_s
    load = os.getloadavg()
    rq = await asyncio.to_thread(
        rq_side.run,
        servers.redis_url,
        runs=runs,
        workers=workers,
        latency_samples=plan.latency_samples,
        gap_s=gap_s,
    )
    async with scratch_database(servers.database_url, "rf_bench_fleet") as url:
        await migrate(url)
        settings = Settings(
            database_url=url, redis_url=servers.redis_url, redis_prefix=bench_prefix("fleet")
        )
        try:
            ours = await runfleet_side.run(
                settings,
                runs=runs,
                workers=workers,
                concurrency=concurrency,
                latency_samples=plan.latency_samples,
                gap_s=gap_s,
            )
            scaled = await scaling.process_counts(
                settings, servers.redis_url, counts=plan.scale, runs=2 * runs,
                concurrency=concurrency,
            )  # fmt: skip
            results = None
            if plan.results is not None:
                results = await result_soak.results(
                    settings, servers.redis_url, runs=plan.results.runs, workers=workers,
                    concurrency=concurrency, samples=plan.results.samples,
                )  # fmt: skip
            store = await Store.open(settings, min_size=1, max_size=2)
            try:
                recovery = None
                if plan.recovery is not None:
                    recovery = await empty_queue(
                        settings, store, workers=workers, kills=plan.recovery.kills,
                        per_kill=plan.recovery.runs, nap_s=plan.recovery.nap_s,
                    )  # fmt: skip
                backlogged = None
                if (behind := plan.backlog_recovery) is not None:
                    backlogged = await with_backlog(
                        settings, store, survivors=workers, concurrency=behind.concurrency,
                        kills=behind.kills, backlog=behind.backlog, nap_ms=behind.nap_ms,
                    )  # fmt: skip
                memory = None
                if plan.memory is not None:
                    memory = await result_soak.in_flight(
                        settings, store, concurrency=plan.memory.runs, nap_s=5.0
                    )
            finally:
                await store.close()
            soaked = None
            if plan.soak is not None:
                soaked = await result_soak.soak(
                    settings, runs=plan.soak.runs, concurrency=concurrency
                )
        finally:
            await drop_keys(servers.redis_url, settings.redis_prefix)
    fsync: tuple[scaling.FsyncRow, ...] = ()
    if plan.fsync:
        fsync = await scaling.fsync_rows(
            servers, runs=2 * runs, workers=workers, concurrency=concurrency
        )
    past = None
    if plan.history_rows:
        past = await scaling.history(
            servers, rows=plan.history_rows, runs=2 * runs, workers=workers,
            concurrency=concurrency,
        )  # fmt: skip
    return FleetBenchResult(
        plan, rq, ours, recovery, memory, load, backlogged, settings.stale_after, scaled,
        fsync, past, results, soaked,
    )  # fmt: skip


def table(result: FleetBenchResult) -> Table:
    """The side-by-side table the ``fleet`` command prints."""
    rq, rf, plan = result.rq, result.runfleet, result.plan
    title = (
        f"fleet: {plan.runs} runs x2 (single + enqueue_many), {plan.workers} workers "
        f"each; runfleet concurrency {plan.concurrency}; load before "
        + " ".join(f"{x:.2f}" for x in result.load_before)
    )
    t = Table(title=title)
    for col, justify in (("", "left"), ("runfleet", "right"), ("rq", "right"), ("ratio", "right")):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]  # justify is one of rich's JustifyMethod literals, typed str here
    t.add_row(
        "enqueue, one call each (runs/s)",
        f"{rf.enqueue_single_per_s:,.0f}",
        f"{rq.enqueue_single_per_s:,.0f}",
        f"{result.ratio('enqueue_single_per_s'):.2f}x",
    )
    t.add_row(
        "enqueue_many (runs/s)",
        f"{rf.enqueue_many_per_s:,.0f}",
        f"{rq.enqueue_many_per_s:,.0f}",
        f"{result.ratio('enqueue_many_per_s'):.2f}x",
    )
    t.add_row(
        "drain, first start to last finish (runs/s)",
        f"{rf.drain.window_rate:,.0f}",
        f"{rq.drain.window_rate:,.0f}",
        f"{result.drain_ratio:.2f}x",
    )
    t.add_row(
        "drain, wall incl. worker start-up (runs/s)",
        f"{rf.drain.wall_rate:,.0f}",
        f"{rq.drain.wall_rate:,.0f}",
        f"{result.drain_wall_ratio:.2f}x",
    )
    for q in (50, 99):
        t.add_row(
            f"idle enqueue -> start p{q} (ms)",
            f"{percentile(rf.latency_ms, q):.1f}",
            f"{percentile(rq.latency_ms, q):.1f}",
            "",
        )
    scaling.add_rows(
        t, scale=result.scale, fsync=result.fsync, rq_drain=rq.drain,
        rq_workers=plan.workers, past=result.history,
    )  # fmt: skip
    if result.results is not None:
        res = result.results
        t.add_row(
            f"drain, producer waits on every result ({res.runs:,} runs, idle workers) (runs/s)",
            f"{res.runfleet_per_s:,.0f}",
            f"{res.rq_per_s:,.0f}",
            f"{res.runfleet_per_s / res.rq_per_s:.2f}x" if res.rq_per_s else "",
        )
        for q in (50, 99):
            t.add_row(
                f"wait() of a settled run p{q} (ms; rq: return_value(refresh=True))",
                f"{percentile(res.runfleet_ms, q):.2f}",
                f"{percentile(res.rq_ms, q):.2f}",
                "",
            )
    if result.recovery is not None:
        rec = result.recovery.as_json()
        t.add_row(
            f"SIGKILL -> re-activated p50 / p99, empty queue ({rec['steals']} steals, "
            f"{rec['kills']} kills)",
            f"{rec['p50_ms'] / 1000:.2f} / {rec['p99_ms'] / 1000:.2f} s",
            "n/a",
            "",
        )
    if result.backlog_recovery is not None:
        rec = result.backlog_recovery.as_json()
        pending = "/".join(str(p) for p in rec["pending_at_kill"])
        t.add_row(
            f"  same, {rec['backlog']:,} runs admitted, busy survivors ({pending} still pending "
            f"at the kills; {rec['steals']} steals, {rec['kills']} kills)",
            f"{rec['p50_ms'] / 1000:.2f} / {rec['p99_ms'] / 1000:.2f} s",
            "n/a",
            "",
        )
    if result.memory is not None:
        mem = result.memory
        t.add_row(
            f"worker RSS, {mem.in_flight} runs in flight (idle / loaded / peak)",
            f"{mem.idle_mb:.0f} / {mem.loaded_mb:.0f} / {mem.peak_mb:.0f} MB",
            "n/a",
            "",
        )
    if result.soak is not None:
        soak = result.soak
        t.add_row(
            f"worker RSS over {soak.runs:,} runs (after warm-up / last / max; growth)",
            f"{soak.warm_mb:.0f} / {soak.last_mb:.0f} / {soak.max_mb:.0f} MB; "
            f"{soak.growth_mb:+.1f} MB",
            "n/a",
            "",
        )
    t.add_section()
    for name, (measured, met) in result.targets().items():
        t.add_row(f"target: {name}", measured, "", "[green]met[/]" if met else "[red]missed[/]")
    return t
