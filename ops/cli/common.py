"""What every ``runfleet`` command shares: connections, one-line errors, time and owner text.

A user mistake (unknown run, bad JSON, a server that does not answer) ends as one
line on stderr and a non-zero exit, never a traceback: operators paste these lines
into tickets, and a traceback buries the one fact that matters.
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
from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console

from broker.client import connect as connect_redis
from broker.liveness import Liveness
from broker.streams import Streams
from store import Store
from store.config import Settings
from store.config import parse_duration_ms as _duration_ms
from store.errors import RunfleetError, RunNotFound
from store.types import Owner, RunRow

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)
T = TypeVar("T")

AsJson = Annotated[
    bool, typer.Option("--json", help="Print JSON (validates against the ops.models model).")
]
CONNECT_TIMEOUT_S = 5
_NO_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)
"""A CLI waits this long for a server before saying it is unreachable (the pool waits 30 s)."""


class UserError(RunfleetError):
    """A mistake in what the user typed (bad JSON, bad duration): message says which."""


def fail(message: str, code: int = 1) -> NoReturn:
    """One clear line and a non-zero exit: no tracebacks for user mistakes."""
    err.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(code)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = ".".join(str(p) for p in problem["loc"])
        fail(f"bad setting RUNFLEET_{field.upper()}: {problem['msg']}")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; turn the errors a user can cause into one line."""
    try:
        return asyncio.run(coro)
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
        fail(f"cannot reach the database: {_first_line(exc)}")
    except (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError) as exc:
        fail(f"cannot reach Redis: {_first_line(exc)}")
    except RedisError as exc:
        fail(f"Redis refused: {_first_line(exc)}")
    except _NO_SCHEMA:
        fail("the database has no runfleet schema: run `runfleet migrate`")
    except psycopg.errors.InsufficientPrivilege as exc:  # a role's least privilege (README)
        fail(f"the database role may not do this: {_first_line(exc)}")
    except psycopg.DataError as exc:  # an argument Postgres cannot hold (a NUL, ...)
        fail(f"invalid input: {_first_line(exc)}")
    except UnicodeEncodeError:  # a lone surrogate in an argument: not encodable as UTF-8
        fail("invalid input: an argument is not valid UTF-8 text (a lone surrogate)")
    except RunfleetError as exc:
        fail(str(exc))
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
    cfg: Settings, *, redis: Literal["no", "yes", "optional"] = "no"
) -> AsyncIterator[Connections]:
    """Postgres always; Redis when asked (``optional``: carry on without it, saying why)."""
    await check_database(cfg.database_url)
    store = await Store.open(cfg, min_size=1, max_size=4)
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
        yield Connections(cfg, store, client, problem)
    finally:
        if client is not None:
            await client.aclose()
        await store.close()


def emit(model: BaseModel) -> None:
    """Print a model as JSON (plain stdout: no rich markup, no wrapping)."""
    typer.echo(model.model_dump_json(indent=2))


# ---- words for times and owners -------------------------------------------------


def clock(ms: int | None) -> str:
    """Local wall-clock time of a database timestamp, to the second."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%H:%M:%S")


def stamp(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


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


def parse_duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``2h``, ``1d`` (a bare number is seconds); the grammar is
    ``store.config.parse_duration_ms``, shared with settings such as RUNFLEET_RETENTION."""
    try:
        return _duration_ms(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def parse_since(text: str, now_ms: int) -> int:
    """A lower bound on admission time: a duration back from now, or an ISO 8601 time."""
    try:
        return now_ms - parse_duration_ms(text)
    except UserError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"bad --since {text!r}: use a duration (15m, 2h) or an ISO time") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


def wall_ms() -> int:
    return int(time.time() * 1000)
