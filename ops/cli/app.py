"""The ``runfleet`` command line (typer + rich)."""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.ops.cli import doctor, fleet, flows, history, produce, roles, runs
from runfleet.ops.cli.common import check_database_url, fail, run, settings
from runfleet.ops.cli.options import CONCURRENCY_MAX, PORT_MAX, PROCESSES_MAX
from runfleet.ops.cli.text import say

__all__ = ["app", "fail", "main"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="runfleet: durable runs for Python worker fleets.",
)


def _print_version(value: bool) -> None:
    if value:
        import runfleet

        say(f"runfleet {runfleet.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="print the version and exit"
        ),
    ] = False,
) -> None:
    pass


@app.command()
def migrate(
    database_url: Annotated[
        str | None, typer.Option(help="defaults to RUNFLEET_DATABASE_URL")
    ] = None,
) -> None:
    """Apply the schema migrations (idempotent; safe to run from many hosts at once).

    Needs a role that owns the database (or may create in it) and, the first time on a
    server, CREATEROLE: migration 0005 creates runfleet's four group roles."""
    import psycopg

    from runfleet.store.migrate import migrate as run_migrations

    url = database_url or settings().database_url
    check_database_url("--database-url", url)

    async def migrating() -> list[int]:
        try:
            return await run_migrations(url)
        except psycopg.errors.InsufficientPrivilege as exc:
            why = str(exc).strip().splitlines()[0]
            fail(
                f"the database role may not migrate: {why} (`runfleet migrate` needs a role "
                "that owns the database and has CREATEROLE: docs/how-to/roles.md)"
            )

    applied = run(migrating())
    say(f"migrations applied: {applied or 'none (up to date)'}")


@app.command()
def worker(
    flows: Annotated[str, typer.Option(help="comma-separated modules that register flows")] = "",
    queues: Annotated[
        str, typer.Option(help="comma-separated queues, in priority order")
    ] = "default",
    concurrency: Annotated[
        int, typer.Option(min=1, max=CONCURRENCY_MAX, help="runs in flight per process")
    ] = 16,
    processes: Annotated[
        int, typer.Option(min=1, max=PROCESSES_MAX, help="worker processes (supervised)")
    ] = 1,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=PORT_MAX,
            help="serve Prometheus metrics (with --processes N, process i uses this port + i)",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_json: Annotated[bool, typer.Option(help="one JSON object per log line")] = False,
    allow_import: Annotated[
        str,
        typer.Option(
            help="comma-separated module prefixes whose plain functions may run, besides "
            "the --flows modules (default: RUNFLEET_ALLOW_IMPORT; nothing else is imported)"
        ),
    ] = "",
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            "-b",
            help="exit once the queues hold nothing it can run now (rq's --burst); exit "
            "status 3 if runs it cannot execute were left for another worker",
        ),
    ] = False,
) -> None:
    """Run worker processes until SIGTERM/SIGINT (twice: release runs immediately).

    Exit status: 0; with --burst, 3 when it drained its queues but left runs it cannot
    execute (each named in a run.left_behind line) for a worker that can."""
    from runfleet.worker.supervisor import WorkerOptions, parse_csv, run_foreground, supervise

    if metrics_port is not None and metrics_port + processes - 1 > PORT_MAX:
        raise typer.BadParameter(
            f"with --processes {processes} the last process would serve port "
            f"{metrics_port + processes - 1}, above {PORT_MAX}",
            param_hint="'--metrics-port'",
        )
    options = WorkerOptions(
        flows=parse_csv(flows),
        queues=parse_csv(queues) or ("default",),
        concurrency=concurrency,
        metrics_port=metrics_port,
        log_level=log_level,
        log_json=log_json,
        allow_import=parse_csv(allow_import),
        burst=burst,
    )
    cfg = settings()
    if processes == 1:
        import psycopg
        import psycopg_pool

        from runfleet.store.reach import address

        try:
            run_foreground(cfg, options)  # ends the process with the worker's status
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            where = address("postgres", cfg.database_url)
            fail(f"cannot reach the database at {where}: {str(exc).strip().splitlines()[0]}")
    from runfleet.worker.logs import configure

    configure(log_level, json_lines=log_json)
    raise typer.Exit(supervise(cfg, options, processes))


def _mount() -> None:
    """Command groups live in their own modules; this file only assembles them."""
    from runfleet.ops.bench.__main__ import app as bench_app
    from runfleet.ops.cli import dashboard, dev, info, prune, queues, retry, schedule

    runs.register(app)
    produce.register(app)
    flows.register(app)
    history.register(app)
    fleet.register(app)
    roles.register(app)
    doctor.register(app)
    prune.register(app)
    dashboard.register(app)
    schedule.register(app)
    retry.register(app)
    app.command("info")(info.info)
    queues.register(app)
    dev.register(app)
    app.add_typer(bench_app, name="bench")


_mount()


def main() -> None:  # pragma: no cover
    app()
