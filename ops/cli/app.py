"""The ``runfleet`` command line (typer + rich)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from runfleet.ops.cli import doctor, fleet, flows, history, produce, roles, runs
from runfleet.ops.cli.common import fail, settings
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
    """Apply the schema migrations (idempotent; safe to run from many hosts at once)."""
    import psycopg

    from runfleet.store.migrate import migrate as run_migrations

    url = database_url or settings().database_url
    try:
        applied = asyncio.run(run_migrations(url))
    except psycopg.OperationalError as exc:
        fail(f"cannot reach the database: {str(exc).strip().splitlines()[0]}")
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
            "--burst", "-b", help="exit once the queues hold nothing to run now (rq's --burst)"
        ),
    ] = False,
) -> None:
    """Run worker processes until SIGTERM/SIGINT (twice: release runs immediately)."""
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
        run_foreground(cfg, options)
        return
    from runfleet.worker.logs import configure

    configure(log_level, json_lines=log_json)
    raise typer.Exit(supervise(cfg, options, processes))


def _mount() -> None:
    """Command groups live in their own modules; this file only assembles them."""
    from runfleet.ops.bench.__main__ import app as bench_app
    from runfleet.ops.cli import dashboard, dev, prune, queues, retry, schedule

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
    queues.register(app)
    dev.register(app)
    app.add_typer(bench_app, name="bench")


_mount()


def main() -> None:  # pragma: no cover
    app()
