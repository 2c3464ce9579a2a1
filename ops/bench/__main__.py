"""``python -m ops.bench COMMAND``: each benchmark is one command of this typer app.

Add a benchmark as a module beside ``store_bench`` plus one ``@app.command`` here that
parses options, calls it, and prints through ``_emit`` (a rich table, or ``--json``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Protocol, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from runfleet.ops.bench import store_bench
from runfleet.ops.bench.scratch import BenchError, server_url

if TYPE_CHECKING:
    from runfleet.ops.bench.backlog import BacklogResult
    from runfleet.ops.bench.fleet_procs import Servers

T = TypeVar("T")

app = typer.Typer(help="runfleet benchmarks (each in a scratch database it drops).")

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Server to benchmark (CREATEDB rights); default RUNFLEET_DATABASE_URL, "
        "else the services runfleet.ops.servers.resolve starts for the app.",
    ),
]
Concurrency = Annotated[int, typer.Option("--concurrency", "-k", min=1, help="Concurrent tasks.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]
Workers = Annotated[int, typer.Option("--workers", min=1, help="Processes per side.")]
OneWorker = Annotated[
    int, typer.Option("--concurrency", "-k", min=1, help="Slots of the one worker.")
]
SkipFsync = Annotated[
    bool,
    typer.Option(
        "--skip-fsync",
        help="Skip the fsync on/off measurements (two throwaway servers the bench starts; "
        "with --database-url: that server as it is, settings never changed).",
    ),
]
SkipDbos = Annotated[
    bool, typer.Option("--skip-dbos", help="Measure runfleet alone (no DBOS needed).")
]


@app.callback()
def main() -> None:
    """runfleet benchmarks."""


def _emit(payload: dict[str, Any], table: Table, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        Console().print(table)


# The peer benchmarks (`fleet` beside rq, `flows` beside DBOS) are lab equipment: the
# wheel leaves their modules out (setup.py's LAB), so they run from a checkout only.
LAB_MISSING = (
    "`runfleet bench {command}` compares runfleet with {peer}; its peer adapters are lab "
    "equipment, not part of the installed package. Run it from a checkout of the runfleet "
    "repository: pip install -e '.[dev,bench]' && runfleet bench {command}"
)


def _lab(command: str, peer: str, *modules: str) -> list[Any]:
    """Import the lab modules a peer benchmark needs, or fail naming the checkout."""
    try:
        return [importlib.import_module(f"runfleet.ops.bench.{m}") for m in modules]
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("runfleet.ops.bench."):
            raise
        typer.echo(LAB_MISSING.format(command=command, peer=peer), err=True)
        raise typer.Exit(code=2) from exc


def _fail(exc: BenchError) -> typer.Exit:
    Console(stderr=True).print(f"[red]bench failed:[/red] {exc}")
    return typer.Exit(code=2)


def _measured(bench: Coroutine[Any, Any, T]) -> T:
    """Run ``bench`` to its result; a BenchError exits 2."""
    try:
        return asyncio.run(bench)
    except BenchError as exc:
        raise _fail(exc) from exc


class _Measured(Protocol):
    def as_json(self) -> dict[str, Any]: ...


M = TypeVar("M", bound=_Measured)


def _measure_and_print(
    bench: Coroutine[Any, Any, M], table: Callable[[M], Table], as_json: bool
) -> None:
    """Run ``bench`` (``_measured``), then print its result as ``table`` or JSON."""
    result = _measured(bench)
    _emit(result.as_json(), table(result), as_json)


def _beside_dbos(command: str, peer: str, module: str, skip_dbos: bool) -> Any:
    """The lab ``module`` of a benchmark beside DBOS (``_lab``); without DBOS installed it
    exits 2 naming what to install, unless the run skips the DBOS side."""
    dbos_side, bench = _lab(command, peer, "dbos_side", module)
    if not skip_dbos and not dbos_side.available():
        raise _fail(BenchError(dbos_side.DBOS_MISSING))
    return bench


def _listed(text: str, option: str, parse: Callable[[str], T]) -> tuple[T, ...]:
    """A comma-separated option's values (``--scale 1,2,4``); a bad one is that option's
    error, named."""
    try:
        return tuple(parse(item.strip()) for item in text.split(",") if item.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{option}: {exc}") from exc


def _on_servers(
    database_url: str | None,
    redis_url: str | None,
    bench: Callable[[Servers], Coroutine[Any, Any, T]],
) -> T:
    """Run ``bench`` on the servers the options name (``fleet_procs.servers``: the URLs,
    the environment's, else throwaways stopped on the way out); a BenchError exits 2."""
    from runfleet.ops.bench.fleet_procs import servers

    try:
        with servers(database_url, redis_url) as found:
            return asyncio.run(bench(found))
    except BenchError as exc:
        raise _fail(exc) from exc


@app.command("store")
def store(
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Lifecycles to time.")] = 2000,
    concurrency: Concurrency = 8,
    warmup: Annotated[
        int | None, typer.Option("--warmup", min=0, help="Untimed lifecycles first.")
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Alternations of runfleet and baseline.")
    ] = 3,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Durable run lifecycles/s against a pgbench-style one-row-commit baseline."""
    try:
        with server_url(database_url) as url:
            result = asyncio.run(
                store_bench.run(
                    url,
                    runs=runs,
                    concurrency=concurrency,
                    warmup=min(200, runs // 10) if warmup is None else warmup,
                    rounds=rounds,
                )
            )
    except BenchError as exc:
        raise _fail(exc) from exc
    _emit(result.as_json(), _store_table(result), as_json)


def _store_table(result: store_bench.StoreBenchResult) -> Table:
    table = Table(
        title=f"store: {result.runs} runs, {result.concurrency} tasks, Postgres "
        f"{result.server_version} (synchronous_commit={result.synchronous_commit})"
    )
    table.add_column("")
    table.add_column("runfleet lifecycles", justify="right")
    table.add_column("baseline commits", justify="right")
    rf, base = result.runfleet, result.baseline
    table.add_row("units", f"{rf.units}", f"{base.units}")
    table.add_row("transactions", f"{rf.transactions}", f"{base.transactions}")
    table.add_row("seconds", f"{rf.seconds:.2f}", f"{base.seconds:.2f}")
    table.add_row("units/s", f"{rf.units_per_s:,.0f} runs/s", f"{base.units_per_s:,.0f}")
    table.add_row(
        "transactions/s", f"{rf.transactions_per_s:,.0f}", f"{base.transactions_per_s:,.0f}"
    )
    table.add_row(
        "p50 / p99 ms",
        f"{rf.percentile(50):.2f} / {rf.percentile(99):.2f}",
        f"{base.percentile(50):.2f} / {base.percentile(99):.2f}",
    )
    table.add_section()
    table.add_row("runs/s ÷ commits/s", f"{result.lifecycle_ratio:.3f}", "")
    table.add_row("tx/s ÷ commits/s", f"{result.transaction_ratio:.3f}", "")
    return table


RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        help="Redis to benchmark; default RUNFLEET_REDIS_URL, else the services "
        "runfleet.ops.servers.resolve starts for the app.",
    ),
]


@app.command("fleet")
def fleet(
    runs: Annotated[
        int, typer.Option("--runs", "-n", min=1, help="Runs per enqueue phase (drain: 2x).")
    ] = 2000,
    workers: Workers = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-k", min=1, help="runfleet slots per worker.")
    ] = 64,
    latency_samples: Annotated[
        int, typer.Option("--latency-samples", min=1, help="Idle enqueue->start samples.")
    ] = 200,
    kills: Annotated[int, typer.Option("--kills", min=1, help="SIGKILLs to time.")] = 3,
    recovery_runs: Annotated[
        int, typer.Option("--recovery-runs", min=1, help="10 s runs admitted before each kill.")
    ] = 50,
    rss_runs: Annotated[
        int, typer.Option("--rss-runs", min=1, help="Runs in flight in the RSS phase.")
    ] = 500,
    skip_recovery: Annotated[
        bool, typer.Option("--skip-recovery", help="Skip the SIGKILL recovery phase.")
    ] = False,
    skip_rss: Annotated[
        bool, typer.Option("--skip-rss", help="Skip the 500-runs-in-flight RSS phase.")
    ] = False,
    backlog: Annotated[
        int, typer.Option("--backlog", min=1, help="Runs pending behind each backlog kill.")
    ] = 1000,
    backlog_kills: Annotated[
        int, typer.Option("--backlog-kills", min=1, help="SIGKILLs to time with a backlog.")
    ] = 2,
    backlog_concurrency: Annotated[
        int, typer.Option("--backlog-concurrency", min=1, help="Slots per worker, backlog phase.")
    ] = 8,
    skip_backlog: Annotated[
        bool, typer.Option("--skip-backlog", help="Skip the SIGKILL-with-backlog phase.")
    ] = False,
    scale: Annotated[
        str,
        typer.Option(
            "--scale",
            help="Process counts to drain 2 x --runs with, each side (comma-separated; '' skips).",
        ),
    ] = "1,2,4",
    skip_fsync: SkipFsync = False,
    history_rows: Annotated[
        int,
        typer.Option(
            "--history-rows",
            min=0,
            help="Settled runs (+3 journal records each) written before the second "
            "history drain; 0 skips the history case.",
        ),
    ] = 1_000_000,
    result_runs: Annotated[
        int, typer.Option("--result-runs", min=1, help="Runs the producer wait()s for.")
    ] = 1000,
    result_samples: Annotated[
        int, typer.Option("--result-samples", min=1, help="wait() calls on settled runs.")
    ] = 200,
    skip_results: Annotated[
        bool, typer.Option("--skip-results", help="Skip the wait() phases.")
    ] = False,
    soak_runs: Annotated[
        int,
        typer.Option(
            "--soak-runs",
            min=0,
            help="Opt-in RSS soak: one worker drains this many runs, RSS sampled every "
            "10,000 (issue 10: 100000). 0, the default, skips it.",
        ),
    ] = 0,
    backlog_depths: Annotated[
        str,
        typer.Option(
            "--backlog-depths",
            help="Instead of the phases above: drain a standing backlog of each depth "
            "(comma-separated, e.g. 1000,10000,100000) with runfleet, rq and Celery side by "
            "side; runs/s from 10%% to 100%% done (docs/explanation/backlogs.md).",
        ),
    ] = "",
    backlog_systems: Annotated[
        str,
        typer.Option(
            "--backlog-systems", help="With --backlog-depths: which of runfleet,rq,celery."
        ),
    ] = "runfleet,rq,celery",
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="With --backlog-depths: preload pg_stat_statements on the bench's throwaway "
            "Postgres and report each runfleet drain's costliest statements (ms and buffers "
            "per call) and the pages of every index on runs before and after (--json).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """runfleet vs rq SimpleWorker: enqueue, drain (1/2/4 processes, fsync on/off, with
    1,000,000 settled runs), wait(), idle start latency; SIGKILL recovery (empty queue,
    and behind a backlog with busy survivors), RSS (and, opt-in, RSS over a long soak).
    With --backlog-depths: the backlog drain by depth beside rq and Celery, alone."""
    if backlog_depths:
        (backlog_bench,) = _lab("fleet --backlog-depths", "rq and Celery", "backlog")
        drained = _backlog(
            backlog_depths,
            backlog_systems,
            workers,
            concurrency,
            database_url,
            redis_url,
            profile=profile,
        )
        _emit(drained.as_json(), backlog_bench.table(drained), as_json)
        return

    (fleet_bench,) = _lab("fleet", "rq", "fleet_bench")

    counts = _listed(scale, "--scale", int)
    result = _on_servers(
        database_url,
        redis_url,
        lambda found: fleet_bench.run(
            found,
            runs=runs,
            workers=workers,
            concurrency=concurrency,
            latency_samples=latency_samples,
            kills=kills,
            recovery_runs=recovery_runs,
            skip_recovery=skip_recovery,
            skip_rss=skip_rss,
            rss_runs=rss_runs,
            skip_backlog=skip_backlog,
            backlog=backlog,
            backlog_kills=backlog_kills,
            backlog_concurrency=backlog_concurrency,
            scale=counts,
            skip_fsync=skip_fsync,
            history_rows=history_rows,
            skip_results=skip_results,
            result_runs=result_runs,
            result_samples=result_samples,
            soak_runs=soak_runs,
        ),
    )
    _emit(result.as_json(), fleet_bench.table(result), as_json)


def _backlog(
    depths: str,
    systems: str,
    workers: int,
    concurrency: int,
    database_url: str | None,
    redis_url: str | None,
    *,
    profile: bool = False,
) -> BacklogResult:
    from runfleet.ops.bench import backlog

    counts = _listed(depths, "--backlog-depths", int)
    chosen = _listed(systems, "--backlog-systems", str)
    return _on_servers(
        database_url,
        redis_url,
        lambda found: backlog.run(
            found,
            depths=counts,
            workers=workers,
            concurrency=concurrency,
            systems=chosen,
            profile=profile,
        ),
    )


@app.command("flows")
def flows(
    count: Annotated[
        int, typer.Option("--flows", "-n", min=1, help="Three-step flows per system.")
    ] = 1000,
    workers: Workers = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-k", min=1, help="Flows in flight per process.")
    ] = 32,
    dbos_polling: Annotated[
        str,
        typer.Option(
            "--dbos-polling", help="DBOS queue polling intervals to run, s (comma-separated)."
        ),
    ] = "1.0,0.05",
    skip_dbos: SkipDbos = False,
    sleep_runs: Annotated[
        int, typer.Option("--sleep-runs", min=1, help="One-second sleeps per sleep mode.")
    ] = 100,
    sleep_gap: Annotated[
        float,
        typer.Option("--sleep-gap", min=0, help="Seconds between sleeps admitted (0: a burst)."),
    ] = 0.02,
    skip_sleep: Annotated[
        bool, typer.Option("--skip-sleep", help="Skip the sleep-lateness phases.")
    ] = False,
    skip_fsync: SkipFsync = False,
    skip_tracing: Annotated[
        bool,
        typer.Option("--skip-tracing", help="Skip the RUNFLEET_OTEL row (needs the otel extra)."),
    ] = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """runfleet vs DBOS: three-step durable flows/s on one Postgres, and with fsync on and
    off, and with tracing on; 1 s sleep lateness."""
    flows_bench = _beside_dbos("flows", "DBOS", "flows_bench", skip_dbos)
    polling = _listed(dbos_polling, "--dbos-polling", float)
    result = _on_servers(
        database_url,
        redis_url,
        lambda found: flows_bench.run(
            found,
            flows=count,
            workers=workers,
            concurrency=concurrency,
            dbos_polling=polling,
            skip_dbos=skip_dbos,
            sleep_runs=sleep_runs,
            sleep_gap=sleep_gap,
            skip_sleep=skip_sleep,
            skip_fsync=skip_fsync,
            skip_tracing=skip_tracing,
        ),
    )
    _emit(result.as_json(), flows_bench.table(result), as_json)


class ProducerPhase(StrEnum):
    """A phase ``bench producer --only`` runs alone."""

    FLOWS = "flows"


@app.command("producer")
def producer(
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Runs per phase.")] = 1000,
    flows: Annotated[
        int, typer.Option("--flows", min=1, help="Three-step flows per loop, each side.")
    ] = 300,
    workers: Workers = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-k", min=1, help="Slots per runfleet/DBOS process.")
    ] = 32,
    samples: Annotated[
        int, typer.Option("--samples", min=1, help="Settled reads and idle starts timed.")
    ] = 200,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Alternations of runfleet and its peer.")
    ] = 3,
    dbos_polling: Annotated[
        float, typer.Option("--dbos-polling", min=0.001, help="DBOS queue polling interval, s.")
    ] = 0.05,
    skip_dbos: SkipDbos = False,
    only: Annotated[
        ProducerPhase | None,
        typer.Option(
            "--only",
            help="Run one phase alone: 'flows' (the three-step flows loop, runfleet and "
            "DBOS alternated round by round).",
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """The producer's path as users write it, vs rq and DBOS in one invocation: single
    enqueue, enqueue_many, the loop of enqueue then wait() (no-op jobs vs rq, three-step
    flows vs DBOS), wait() of a settled run, idle enqueue -> start; each target met or
    missed."""
    producer_bench = _beside_dbos("producer", "rq and DBOS", "producer_bench", skip_dbos)
    if only is ProducerPhase.FLOWS:
        alone = _on_servers(
            database_url,
            redis_url,
            lambda found: producer_bench.run_flows_only(
                found,
                flows=flows,
                workers=workers,
                concurrency=concurrency,
                rounds=rounds,
                dbos_polling=dbos_polling,
                skip_dbos=skip_dbos,
            ),
        )
        _emit(alone.as_json(), producer_bench.flows_table(alone), as_json)
        return
    result = _on_servers(
        database_url,
        redis_url,
        lambda found: producer_bench.run(
            found,
            runs=runs,
            flows=flows,
            workers=workers,
            concurrency=concurrency,
            samples=samples,
            rounds=rounds,
            dbos_polling=dbos_polling,
            skip_dbos=skip_dbos,
        ),
    )
    _emit(result.as_json(), producer_bench.table(result), as_json)


@app.command("capacity")
def capacity(
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Runs per batch.")] = 1000,
    concurrency: OneWorker = 32,
    idle: Annotated[
        float, typer.Option("--idle", min=1, help="Seconds to measure an idle worker.")
    ] = 10.0,
    as_json: AsJson = False,
) -> None:
    """Per-run and per-step statements, write transactions, WAL and Redis commands;
    connections per process; an idle worker's background (own throwaway servers)."""
    from runfleet.ops.bench import capacity as cap
    from runfleet.store.config import Settings

    bench = cap.run(Settings(), runs=runs, concurrency=concurrency, idle_s=idle)
    _measure_and_print(bench, cap.table, as_json)


@app.command("limits")
def limits(
    runs: Annotated[int, typer.Option("--runs", "-n", min=1, help="Runs per setting.")] = 500,
    concurrency: OneWorker = 32,
    rate: Annotated[
        float, typer.Option("--rate", min=1, help="The binding rate, starts per second.")
    ] = 200.0,
    as_json: AsJson = False,
) -> None:
    """What a queue's limits cost the claim path: claim statements and the reads beside
    them per run, unlimited vs limits that do not bind vs a binding rate vs keyed."""
    from runfleet.ops.bench import limits as lim
    from runfleet.store.config import Settings

    bench = lim.run(Settings(), runs=runs, concurrency=concurrency, rate_per_s=rate)
    _measure_and_print(bench, lim.table, as_json)


if __name__ == "__main__":
    app()
