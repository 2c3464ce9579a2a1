"""``runfleet dashboard``: serve the web UI (ops.dashboard) with uvicorn.

It binds 127.0.0.1 by default: the dashboard acts with the database role of
RUNFLEET_DATABASE_URL and the scopes given here, and has no login of its own, so
whoever reaches its port acts as that role. Binding another address is a choice to
make behind an authenticating proxy.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import PORT_MAX
from runfleet.ops.cli.text import say

_ANY = {"0.0.0.0", "::", ""}


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


def dashboard(
    host: Annotated[str, typer.Option(help="Address to bind (default: this host only).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=PORT_MAX, help="Port to listen on.")] = 8080,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope", help="A scope the dashboard's buttons hold (repeatable), as for the CLI."
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A Host header name to answer (repeatable); others are refused "
            "(DNS rebinding). Default: the bound address and localhost.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "warning",
) -> None:
    """Serve the live web dashboard: overview, runs, one run (with its buttons), fleet."""
    try:
        import uvicorn

        from runfleet.ops.dashboard.app import create_app
    except ImportError as exc:
        c.fail(
            f"the dashboard needs its extra ({exc.name} is missing): "
            "pip install 'runfleet[dashboard]'"
        )
    cfg = c.settings()
    c.run(c.check_database(cfg.database_url))
    hosts = tuple(allowed_host or ())
    if not hosts:
        hosts = ("*",) if host in _ANY else (host, "127.0.0.1", "localhost", "::1")
    if host not in ("127.0.0.1", "localhost", "::1"):
        c.warn(
            f"listening on {host}: anyone who reaches port {port} "
            "acts with this database role and these scopes (the dashboard has no login)"
        )
    app = create_app(cfg, scopes=tuple(scope or ()), allowed_hosts=hosts)
    say(f"runfleet dashboard on http://{host}:{port}/")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
