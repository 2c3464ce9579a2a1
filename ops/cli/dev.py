"""``runfleet dev start|status|stop|reset``: the embedded Postgres and Redis of this user.

Any runfleet process with no URL configured starts them when the ``embedded`` extra is
installed (``store.urls``); they outlive it, and these commands manage them. They never
touch servers named by ``RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL``.
"""

from __future__ import annotations

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.text import say
from runfleet.runtime import embedded
from runfleet.store.config import Settings
from runfleet.store.errors import NoServers
from runfleet.store.urls import resolve

dev = typer.Typer(
    no_args_is_help=True, help="The embedded Postgres and Redis for trying and developing."
)

STOPPED_EXIT = 3
"""``status`` when a server is not running (systemctl's code for "not running")."""


def register(app: typer.Typer) -> None:
    app.add_typer(dev, name="dev")


@dev.command()
def start() -> None:
    """Start the pair (or find it running) and migrate it; prints both URLs.

    The configured URLs, if any, are left out of it: this command is about the pair."""
    unset = {"database_url": "", "redis_url": ""}
    try:
        resolve(Settings().model_copy(update=unset))
    except NoServers as exc:
        c.fail(str(exc))


@dev.command()
def status() -> None:
    """Each server's URL and pid, or "stopped" (exit 3 when either is not running)."""
    running = embedded.status()
    say(f"data: {embedded.data_dir()}")
    pg, rd = running["postgres"], running["redis"]
    say(
        f"postgres: postgresql://postgres@127.0.0.1:{pg.port}/postgres (pid {pg.pid})"
        if pg
        else "postgres: stopped"
    )
    say(f"redis: redis://127.0.0.1:{rd.port}/0 (pid {rd.pid})" if rd else "redis: stopped")
    if pg is None or rd is None:
        raise typer.Exit(STOPPED_EXIT)


@dev.command()
def stop() -> None:
    """Stop the pair; the data stays for the next start."""
    stopped = embedded.stop()
    say(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@dev.command()
def reset(
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask"),
) -> None:
    """Stop the pair and delete its data (every run, journal and queue in it)."""
    if not yes:
        typer.confirm(f"delete every run in {embedded.data_dir()}?", abort=True)
    embedded.reset()
    say(f"reset: {embedded.data_dir()} is empty; the next runfleet process starts afresh")
