"""``runfleet bench COMMAND``: what an operator measures on their own servers and machine.

``store`` (durable lifecycles against the server's own commit rate), ``capacity`` (what
one run costs Postgres and Redis) and ``limits`` (what a queue's limits cost the claim
path) are runfleet's. The benchmarks beside its peers (``fleet``, ``backlog``, ``flows``,
``producer``) live in a checkout's bench/ folder: here they are thin entries that run it
from a checkout, or say how.

Add an operator's benchmark as a module beside ``store_bench`` plus one ``@app.command``
here that parses options, calls it, and prints through ``_emit`` (a rich table, or
``--json``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Protocol, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from runfleet.ops.bench import store_bench
from runfleet.ops.bench.procs import ROOT
from runfleet.ops.bench.scratch import BenchError, server_url

T = TypeVar("T")

app = typer.Typer(
    help="runfleet benchmarks: your servers and machine (each in a scratch database it "
    "drops); beside rq, Celery and DBOS from a checkout (python -m bench)."
)

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
OneWorker = Annotated[
    int, typer.Option("--concurrency", "-k", min=1, help="Slots of the one worker.")
]


@app.callback()
def main() -> None:
    """runfleet benchmarks."""


def _emit(payload: dict[str, Any], table: Table, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        Console().print(table)


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


# ---- the peer benchmarks: a checkout's bench/ folder -------------------------------------

PEERS = {
    "fleet": "rq",
    "backlog": "rq and Celery",
    "flows": "DBOS",
    "producer": "rq, Celery and DBOS",
}
"""The benchmarks beside runfleet's peers: ``python -m bench COMMAND`` in a checkout."""

CHECKOUT_ONLY = (
    "`runfleet bench {command}` compares runfleet with {peer}. The peer benchmarks are not "
    "part of the installed package: they live in the bench/ folder of the runfleet "
    "repository and run from a checkout, from its root:\n"
    "  pip install -e '.[dev,bench]'\n"
    "  python -m bench {command} --help"
)


def peer_app() -> Any | None:
    """bench/'s typer app when this runfleet runs from a checkout that has it, else None.

    Looked up beside the folder runfleet/ is in (a checkout's root; site-packages has no
    bench/ of runfleet's), never as whatever ``bench`` the path happens to hold.
    """
    checkout = ROOT
    if not (checkout / "bench" / "__main__.py").is_file():
        return None
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        module = importlib.import_module("bench.__main__")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "bench":
            raise
        return None
    found: Any = getattr(module, "app", None)
    return found


def _peer_command(command: str, peer: str) -> None:
    def run_peer(ctx: typer.Context) -> None:
        peers = peer_app()
        if peers is None:
            typer.echo(CHECKOUT_ONLY.format(command=command, peer=peer), err=True)
            raise typer.Exit(code=2)
        peers(args=[command, *ctx.args], prog_name="python -m bench")

    app.command(
        command,
        help=f"runfleet beside {peer}: python -m bench {command} in a checkout (bench/).",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(run_peer)


for _command, _peer in PEERS.items():
    _peer_command(_command, _peer)


if __name__ == "__main__":
    app()
