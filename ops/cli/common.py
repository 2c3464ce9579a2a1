"""What every ``runfleet`` command shares: connections, one-line errors, time and owner text.

A user mistake (unknown run, bad JSON, a server that does not answer) ends as one
line on stderr and a non-zero exit, never a traceback: operators paste these lines
into tickets, and a traceback buries the one fact that matters. Every line is printed
through ``ops.cli.text`` (``say``, ``warn``, ``fail``, ``emit``): literally, control
characters escaped, never parsed as rich markup.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import psycopg
import psycopg_pool
import typer
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis
from redis.connection import parse_url as parse_redis_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runfleet.broker.client import cluster_url
from runfleet.broker.client import connect as connect_redis
from runfleet.broker.liveness import Liveness
from runfleet.broker.streams import Streams
from runfleet.ops.cli.options import UserError as UserError
from runfleet.ops.cli.text import Part, err, json_text, say, styled
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import NoServers, RunfleetError, RunNotFound
from runfleet.store.topology import Role, Topology, read_topology
from runfleet.store.types import Owner, RunRow
from runfleet.store.urls import resolve

T = TypeVar("T")

AsJson = Annotated[
    bool,
    typer.Option("--json", help="Print JSON (validates against the runfleet.ops.models model)."),
]
Wide = Annotated[
    bool,
    typer.Option(
        "--wide",
        help="One whole line per row, whatever the terminal's width (piped output always is).",
    ),
]
CONNECT_TIMEOUT_S = 5
_NO_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)
"""A CLI waits this long for a server before saying it is unreachable (the pool waits 30 s)."""


def fail(message: str, code: int = 1) -> NoReturn:
    """One clear line and a non-zero exit: no tracebacks for user mistakes.

    The message is printed literally: a ``[...]`` in it (``runfleet[dashboard]``, a run
    id) is text, not rich markup, and a control character in it shows as its escape."""
    say(styled("error:", "red"), " ", message, stream=err)
    raise typer.Exit(code)


def warn(*parts: Part) -> None:
    """A warning line on stderr; the command goes on."""
    say(styled("warning:", "yellow"), " ", *parts, stream=err)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def settings() -> Settings:
    """The settings with both URLs: the configured ones, else the embedded pair (started
    and migrated if need be), else one line naming both ways out (``store.urls``)."""
    try:
        cfg = resolve(Settings())
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = ".".join(str(p) for p in problem["loc"])
        fail(f"bad setting RUNFLEET_{field.upper()}: {problem['msg']}")
    except NoServers as exc:
        fail(str(exc))
    check_database_url("RUNFLEET_DATABASE_URL", cfg.database_url)
    if cfg.read_database_url:
        check_database_url("RUNFLEET_READ_DATABASE_URL", cfg.read_database_url)
    check_redis_url("RUNFLEET_REDIS_URL", cfg.redis_url)
    return cfg


def check_database_url(name: str, url: str) -> None:
    """A URL libpq cannot parse ends here as one line naming the setting, not as a
    ``ProgrammingError`` traceback from deep inside the first connection attempt."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error as exc:
        fail(f"bad {name}: {_first_line(exc)} (expected postgresql://user@host:port/database)")
    ports = str(parts.get("port") or "5432").split(",")
    if not all(port.strip().isdigit() for port in ports):
        fail(f"bad {name}: port {parts.get('port')!r} is not a number")


def check_redis_url(name: str, url: str) -> None:
    try:
        # a cluster URL (redis+cluster://) is checked as the plain URL its client is given
        parse_redis_url(cluster_url(url) or url)  # type: ignore[no-untyped-call]  # redis-py leaves parse_url unannotated
    except ValueError as exc:
        fail(f"bad {name}: {_first_line(exc)} (expected redis://host:port/db)")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; turn the errors a user can cause into one line."""
    try:
        return asyncio.run(coro)
    except RunfleetError as exc:  # first: a RunFailed may also be the run's TimeoutError
        fail(str(exc))
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
        fail(f"cannot reach the database: {_first_line(exc)}")
    except (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError) as exc:
        fail(f"cannot reach Redis: {_first_line(exc)}")
    except RedisError as exc:
        fail(f"Redis refused: {_first_line(exc)}")
    except _NO_SCHEMA:
        fail("the database has no runfleet schema: run `runfleet migrate`")
    except psycopg.errors.InsufficientPrivilege as exc:  # least privilege: docs/how-to/roles.md
        fail(f"the database role may not do this: {_first_line(exc)}")
    except psycopg.DataError as exc:  # an argument Postgres cannot hold (a NUL, ...)
        fail(f"invalid input: {_first_line(exc)}")
    except UnicodeEncodeError:  # a lone surrogate in an argument: not encodable as UTF-8
        fail("invalid input: an argument is not valid UTF-8 text (a lone surrogate)")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@dataclass
class Connections:
    """Open connections for one command. ``redis`` is None when the command needs none."""

    settings: Settings
    store: Store
    redis: Redis | None
    redis_error: str | None = None
    """Why Redis is missing when the command could do without it (``redis="optional"``)."""
    replica: Topology | None = None
    """The replica this command reads from (``read=True`` and RUNFLEET_READ_DATABASE_URL)."""

    @property
    def liveness(self) -> Liveness:
        assert self.redis is not None
        return Liveness.for_settings(self.redis, self.settings)

    @property
    def streams(self) -> Streams:
        assert self.redis is not None
        return Streams(self.redis, self.settings.redis_prefix)

    async def run_row(self, run_id: str) -> RunRow:
        row = await self.store.runs.get(run_id)
        if row is None:
            raise RunNotFound(run_id)
        return row


async def check_database(url: str) -> None:
    """Fail fast (``CONNECT_TIMEOUT_S``) instead of letting the pool retry for 30 s."""
    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
    await conn.close()


def redis_client(cfg: Settings) -> Redis:
    return connect_redis(cfg, socket_timeout=CONNECT_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S)


@asynccontextmanager
async def connect(
    cfg: Settings, *, redis: Literal["no", "yes", "optional"] = "no", read: bool = False
) -> AsyncIterator[Connections]:
    """Postgres always; Redis when asked (``optional``: carry on without it, saying why).

    ``read``: a read-only command, which reads RUNFLEET_READ_DATABASE_URL when set and
    says on stderr how far that replica's replay lags (its answer may be that old).
    """
    replica: Topology | None = None
    if read and cfg.read_database_url:
        cfg = cfg.model_copy(update={"database_url": cfg.read_database_url})
    await check_database(cfg.database_url)
    store = await Store.open(cfg, min_size=1, max_size=4)
    if read and cfg.read_database_url:
        replica = await read_topology(store.db)
        typer.echo(replica_note(replica), err=True)
    client = redis_client(cfg) if redis != "no" else None
    problem: str | None = None
    try:
        if client is not None:
            try:
                await client.ping()
            except (RedisError, OSError) as exc:
                if redis == "yes":
                    raise
                problem = _first_line(exc)
                await client.aclose()
                client = None
        yield Connections(cfg, store, client, problem, replica)
    finally:
        if client is not None:
            await client.aclose()
        await store.close()


def replica_note(seen: Topology) -> str:
    """The line a read from RUNFLEET_READ_DATABASE_URL prints before its answer."""
    if seen.role is not Role.STANDBY:
        return "read from RUNFLEET_READ_DATABASE_URL (a primary: current)"
    lag = "unknown" if seen.replay_lag_s is None else f"{seen.replay_lag_s:.1f} s"
    behind = seen.receive_behind_bytes
    pending = f", {behind} B received and not yet replayed" if behind else ""
    return (
        f"read from a replica (RUNFLEET_READ_DATABASE_URL): replay lag {lag}{pending}; "
        "what follows may be that old (the lag also grows while the primary is idle)"
    )


def emit(model: BaseModel, *, indent: int | None = 2) -> None:
    """Print a model as JSON (plain stdout: no rich markup, no wrapping); ``indent=None``
    for one object per line. No character in it is one a terminal acts on."""
    typer.echo(json_text(model.model_dump_json(indent=indent)))


# ---- words for times and owners -------------------------------------------------


def clock(ms: int | None) -> str:
    """Local wall-clock time of a database timestamp, to the second."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a time no calendar here can show
        return f"{ms} ms after 1970"


def stamp(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        when = datetime.fromtimestamp(ms / 1000, UTC).astimezone()
    except (OverflowError, OSError, ValueError):  # year 1 in a zone west of UTC, ...
        return f"{ms} ms after 1970"
    return when.strftime("%Y-%m-%d %H:%M:%S %Z")


def seconds(ms: float) -> str:
    """A duration in words a person reads at a glance: 0.4 s, 6.2 s, 3 min 5 s, 2 h 4 min."""
    s = ms / 1000
    if abs(s) < 60:
        return f"{s:.1f} s"
    m, s = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min"
    return f"{h // 24} d {h % 24} h"


def who(owner: Owner | str | None) -> str:
    """``host-b pid 412``: how a person names a worker process."""
    if isinstance(owner, str):
        parsed = Owner.parse(owner)
        return f"{parsed.host_id} pid {parsed.pid}" if parsed else owner
    if owner is None:
        return "nobody"
    return f"{owner.host_id} pid {owner.pid}"


def wall_ms() -> int:
    return int(time.time() * 1000)
