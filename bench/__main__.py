"""``python -m bench COMMAND`` from the repository's root: runfleet beside its peers.

Each benchmark is one command of this typer app: ``fleet`` (rq), ``backlog`` (rq and
Celery), ``flows`` (DBOS), ``producer`` (rq, Celery, procrastinate and DBOS). They run
from a checkout (``pip install -e '.[dev,bench]'`` installs the peers), never from the
wheel; what an operator measures on their own servers is ``runfleet bench store|capacity|limits``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from bench import dbos_side
from bench.plan import FleetPlan, Phase
from bench.servers import Servers, servers
from runfleet.ops.bench.scratch import BenchError

T = TypeVar("T")

app = typer.Typer(
    help="runfleet beside its peers (rq, Celery, procrastinate, DBOS), each run in scratch "
    "databases and Redis keys it drops. Run from the repository's root: python -m bench COMMAND."
)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Server to benchmark (CREATEDB rights); default RUNFLEET_DATABASE_URL, "
        "else the services runfleet.ops.servers.resolve starts for the app.",
    ),
]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        help="Redis to benchmark; default RUNFLEET_REDIS_URL, else the services "
        "runfleet.ops.servers.resolve starts for the app.",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]
Workers = Annotated[int, typer.Option("--workers", min=1, help="Processes per side.")]
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
    """runfleet beside its peers."""


def _emit(payload: dict[str, Any], tables: list[Table], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        console = Console()
        for table in tables:
            console.print(table)


def _fail(exc: BenchError) -> typer.Exit:
    Console(stderr=True).print(f"[red]bench failed:[/red] {exc}")
    return typer.Exit(code=2)


def _listed(text: str, option: str, parse: Callable[[str], T]) -> tuple[T, ...]:
    """A comma-separated option's values (``--depths 1000,10000``); a bad one is that
    option's error, named."""
    try:
        return tuple(parse(item.strip()) for item in text.split(",") if item.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{option}: {exc}") from exc


def _on_servers(
    database_url: str | None,
    redis_url: str | None,
    bench: Callable[[Servers], Coroutine[Any, Any, T]],
) -> T:
    """Run ``bench`` on the servers the options name (``bench.servers.servers``: the URLs,
    the environment's, else throwaways stopped on the way out); a BenchError exits 2."""
    try:
        with servers(database_url, redis_url) as found:
            return asyncio.run(bench(found))
    except BenchError as exc:
        raise _fail(exc) from exc


def _without_dbos_exit(skip_dbos: bool) -> None:
    """Without DBOS installed, exit 2 naming what to install, unless the run skips it."""
    if not skip_dbos and not dbos_side.available():
        raise _fail(BenchError(dbos_side.DBOS_MISSING))


# ---- fleet -----------------------------------------------------------------------------


def fleet_plan(
    plan_file: Path | None,
    runs: int | None,
    workers: int | None,
    concurrency: int | None,
    skip: str,
) -> FleetPlan:
    """The plan a ``fleet`` command line describes: the file's (else the defaults), then
    the options given, then the phases skipped."""
    try:
        plan = FleetPlan() if plan_file is None else FleetPlan.read(plan_file)
    except BenchError as exc:
        raise typer.BadParameter(str(exc), param_hint="--plan") from exc
    given = {"runs": runs, "workers": workers, "concurrency": concurrency}
    plan = plan.model_copy(update={k: v for k, v in given.items() if v is not None})
    return plan.without(frozenset(_listed(skip, "--skip", Phase)))


@app.command("fleet")
def fleet(
    plan_file: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            help="A plan file (TOML or JSON: bench.plan.FleetPlan's fields; bench/plans/ "
            "has examples); the options below override it.",
        ),
    ] = None,
    runs: Annotated[
        int | None, typer.Option("--runs", "-n", min=1, help="Runs per enqueue phase.")
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Per side.")] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-k", min=1, help="Slots per worker.")
    ] = None,
    skip: Annotated[
        str,
        typer.Option(
            "--skip",
            help="Phases to leave out, comma-separated: " + ", ".join(p.value for p in Phase),
        ),
    ] = "",
    show_plan: Annotated[
        bool, typer.Option("--show-plan", help="Print the plan as JSON and measure nothing.")
    ] = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """runfleet vs rq SimpleWorker: enqueue, drain (1/2/4 processes, fsync on/off, with
    1,000,000 settled runs), wait(), idle start latency; SIGKILL recovery (empty queue,
    and behind a backlog with busy survivors), RSS (and, in the plan, over a long soak)."""
    plan = fleet_plan(plan_file, runs, workers, concurrency, skip)
    if show_plan:
        typer.echo(plan.model_dump_json(indent=2))
        return
    from bench import fleet_bench

    result = _on_servers(database_url, redis_url, lambda found: fleet_bench.run(found, plan))
    _emit(result.as_json(), [fleet_bench.table(result)], as_json)


# ---- backlog ---------------------------------------------------------------------------


@app.command("backlog")
def backlog(
    depths: Annotated[
        str,
        typer.Option(
            "--depths", help="Backlog depths to drain, comma-separated (e.g. 1000,10000,100000)."
        ),
    ] = "1000,10000,100000",
    systems: Annotated[
        str, typer.Option("--systems", help="Which of runfleet,rq,celery (comma-separated).")
    ] = "runfleet,rq,celery",
    workers: Workers = 2,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-k", min=1, help="runfleet slots per worker.")
    ] = 64,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Preload pg_stat_statements on the bench's throwaway Postgres and report "
            "each runfleet drain's costliest statements (ms and buffers per call) and the "
            "pages of every index on runs before and after (--json).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """A standing backlog of each depth drained by runfleet, rq and Celery side by side;
    runs/s from 10% to 100% done (docs/explanation/backlogs.md)."""
    from bench import backlog as backlog_bench

    counts = _listed(depths, "--depths", int)
    chosen = _listed(systems, "--systems", str)
    drained = _on_servers(
        database_url,
        redis_url,
        lambda found: backlog_bench.run(
            found,
            depths=counts,
            workers=workers,
            concurrency=concurrency,
            systems=chosen,
            profile=profile,
        ),
    )
    _emit(drained.as_json(), [backlog_bench.table(drained)], as_json)


# ---- flows -----------------------------------------------------------------------------


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
    _without_dbos_exit(skip_dbos)
    from bench import flows_bench

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
    _emit(result.as_json(), [flows_bench.table(result)], as_json)


# ---- producer --------------------------------------------------------------------------


class ProducerPhase(StrEnum):
    """A phase ``producer --only`` runs alone."""

    FLOWS = "flows"
    SHAPES = "shapes"


@app.command("producer")
def producer(
    runs: Annotated[
        int, typer.Option("--runs", "-n", min=1, help="Runs per phase (calls per shape).")
    ] = 1000,
    flows: Annotated[
        int, typer.Option("--flows", min=1, help="Three-step flows per loop, each side.")
    ] = 300,
    workers: Workers = 2,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-k", min=1, help="Slots per runfleet/DBOS/procrastinate process."
        ),
    ] = 32,
    samples: Annotated[
        int, typer.Option("--samples", min=1, help="Settled reads and idle starts timed.")
    ] = 200,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Alternations of runfleet and its peers.")
    ] = 3,
    threads: Annotated[
        int, typer.Option("--threads", min=1, help="Threads sharing one Queue (threads shape).")
    ] = 16,
    tasks: Annotated[
        int,
        typer.Option("--tasks", min=1, help="asyncio tasks sharing one AsyncQueue (tasks shape)."),
    ] = 64,
    dbos_polling: Annotated[
        float, typer.Option("--dbos-polling", min=0.001, help="DBOS queue polling interval, s.")
    ] = 0.05,
    skip_dbos: SkipDbos = False,
    skip_celery: Annotated[
        bool, typer.Option("--skip-celery", help="Leave Celery out of the shapes.")
    ] = False,
    skip_procrastinate: Annotated[
        bool,
        typer.Option(
            "--skip-procrastinate", help="Leave procrastinate out (shapes and idle start)."
        ),
    ] = False,
    only: Annotated[
        ProducerPhase | None,
        typer.Option(
            "--only",
            help="Run one phase alone: 'flows' (the three-step flows loop, runfleet and "
            "DBOS alternated round by round) or 'shapes' (one thread, threads, tasks; "
            "enqueue alone and enqueue then wait(), beside rq, Celery and procrastinate).",
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """The producer's path as users write it, vs rq, Celery, procrastinate and DBOS in one
    invocation: single enqueue, enqueue_many, the loop of enqueue then wait() (no-op jobs
    vs rq, three-step flows vs DBOS), wait() of a settled run, idle enqueue -> start (vs rq
    and procrastinate); then each service shape (one thread, threads, asyncio tasks) with
    its rate, p50 and p99."""
    from bench import producer_bench, shapes

    if only is ProducerPhase.SHAPES:
        shaped = _on_servers(
            database_url,
            redis_url,
            lambda found: shapes.run(
                found, runs=runs, threads=threads, tasks=tasks, workers=workers,
                concurrency=concurrency, rounds=rounds, celery=not skip_celery,
                procrastinate=not skip_procrastinate,
            ),
        )  # fmt: skip
        _emit({"benchmark": "producer", "only": "shapes", **shaped.as_json()},
              [shapes.table(shaped)], as_json)  # fmt: skip
        return
    _without_dbos_exit(skip_dbos)
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
        _emit(alone.as_json(), [producer_bench.flows_table(alone)], as_json)
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
            threads=threads,
            tasks=tasks,
            skip_celery=skip_celery,
            skip_procrastinate=skip_procrastinate,
        ),
    )
    tables = [producer_bench.table(result)]
    if result.shapes is not None:
        tables.append(shapes.table(result.shapes))
    _emit(result.as_json(), tables, as_json)


if __name__ == "__main__":
    app(prog_name="python -m bench")
