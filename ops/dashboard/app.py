"""The dashboard's ASGI app (Starlette): pages, their live fragments, the JSON API, the buttons.

One set of connections (a small Postgres pool, one Redis client, one producer queue)
is opened at startup and shared by every request. Every page is a template whose
``#live`` part the page's script re-fetches every ``POLL_MS`` (with ``X-Partial: 1``,
the server renders only that part), so pages follow runs as they move without a
reload, and read as plain HTML without JavaScript.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs

import psycopg
import psycopg_pool
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import LIST_MAX, since
from runfleet.ops.cli.runs import detail_view, list_view, tree_view
from runfleet.ops.cli.text import literal
from runfleet.ops.dashboard import data, security, svg
from runfleet.ops.dashboard.actions import Action, fitting, perform
from runfleet.ops.dashboard.lifecycle import lifecycle
from runfleet.ops.dashboard.urls import action_id, api_id, page_id, run_url
from runfleet.ops.explain.report import explain, gather
from runfleet.ops.models import AnswerResult, ReadAnswer
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, RunfleetError, RunNotFound, ScopeDenied, Unavailable
from runfleet.store.topology import Role, Topology, read_topology
from runfleet.store.types import RunStatus

POLL_MS = 1000
RUNS_LIMIT = 100

_env = Environment(
    loader=PackageLoader("runfleet.ops.dashboard", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals.update(
    clock=c.clock,
    stamp=c.stamp,
    seconds=c.seconds,
    chart=svg.chart,
    statuses=list(RunStatus),
    run_url=run_url,
)
_env.filters["literal"] = literal  # an id as text: its bidi overrides and controls shown


@dataclass
class Dashboard:
    conns: c.Connections
    queue: AsyncQueue
    tail: data.JournalTail
    scopes: tuple[str, ...]


def _dash(request: Request) -> Dashboard:
    dash: Dashboard = request.app.state.dash
    return dash


Answer = TypeVar("Answer", bound=ReadAnswer)


async def _replica(conns: c.Connections) -> Topology | None:
    """The replica this request's answer was read from, as it is now (its replay lag);
    None when the primary answered (no RUNFLEET_READ_DATABASE_URL, or it names a primary).

    Every page and API answer read through ``conns`` carries it: ``_stamped`` puts the
    lag in the JSON, ``_page`` hands it to the page (the ``replica_note`` macro)."""
    if conns.replica is None:
        return None
    seen = await read_topology(conns.store.db)
    return seen if seen.role is Role.STANDBY else None


def _stamped(answer: Answer, replica: Topology | None) -> Answer:
    """The answer with the lag of the replica it was read from (unchanged: the primary)."""
    if replica is None:
        return answer
    return answer.model_copy(update={"replica_lag_s": replica.replay_lag_s})


def _page(
    request: Request,
    name: str,
    status_code: int = 200,
    replica: Topology | None = None,
    **ctx: Any,
) -> Response:
    """The whole page, or only its live part when the page's script asks for it;
    ``replica``: the replica it was read from (the page says how old it may be)."""
    partial = request.headers.get("x-partial") == "1"
    template = _env.get_template(f"{name}_live.html" if partial else f"{name}.html")
    body = template.render(
        request=request,
        csrf=security.token(request),
        poll_ms=POLL_MS,
        scopes=_dash(request).scopes,
        replica=replica,
        **ctx,
    )
    response = HTMLResponse(body, status_code=status_code)
    response.headers["cache-control"] = "no-store"
    return security.remember(request, response)


def _json(model: BaseModel, status_code: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def _problem(request: Request, status_code: int, message: str) -> Response:
    if request.url.path.startswith("/api/") or "application/json" in request.headers.get(
        "accept", ""
    ):
        return JSONResponse({"error": message}, status_code=status_code)
    return _page(request, "error", status_code=status_code, message=message, code=status_code)


Handler = Callable[[Request], Awaitable[Response]]


def _answers(handler: Handler) -> Handler:
    """Turn what a user can cause into a status code and one sentence, as the CLI does."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except RunNotFound as exc:
            return _problem(request, 404, str(exc))
        except ScopeDenied as exc:
            return _problem(request, 403, str(exc))
        except (c.UserError, InvalidInput, ValueError) as exc:
            return _problem(request, 400, str(exc))
        except psycopg.errors.InsufficientPrivilege as exc:
            return _problem(request, 403, f"the database role may not do this: {exc}")
        except psycopg.DataError as exc:  # a text Postgres cannot hold (a NUL in an id, ...)
            return _problem(request, 400, f"invalid input: {exc}")
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            return _problem(request, 503, f"cannot reach the database: {exc}")
        except Unavailable as exc:
            return _problem(request, 503, str(exc))
        except RunfleetError as exc:  # any other refusal a caller can cause
            return _problem(request, 400, str(exc))

    return wrapped


# ---- pages -----------------------------------------------------------------------


@_answers
async def overview(request: Request) -> Response:
    conns = _dash(request).conns
    view = await data.overview(conns, _dash(request).tail)
    replica = await _replica(conns)
    view = _stamped(view, replica)
    if request.url.path.startswith("/api/"):
        return _json(view)
    return _page(request, "overview", replica=replica, view=view)


def _filters(request: Request) -> dict[str, Any]:
    q = request.query_params
    status = q.get("status") or None
    limit = int(q.get("limit") or RUNS_LIMIT)
    return {
        "status": RunStatus(status) if status else None,
        "flow": q.get("flow") or None,
        "queue": q.get("queue") or None,
        "since": since(q["since"]) if q.get("since") else None,
        "limit": max(1, min(limit, LIST_MAX)),
    }


@_answers
async def runs(request: Request) -> Response:
    f = _filters(request)
    conns = _dash(request).conns
    listing = await list_view(conns, **f)
    replica = await _replica(conns)
    listing = _stamped(listing, replica)
    if request.url.path.startswith("/api/"):
        return _json(listing)
    return _page(request, "runs", replica=replica, listing=listing, f=f)


@_answers
async def run(request: Request) -> Response:
    run_id = page_id(request)
    if not run_id:
        return RedirectResponse("/runs", status_code=307)
    conns = _dash(request).conns
    detail = await detail_view(conns, run_id)
    explanation = explain(await gather(conns, run_id))
    journal = await data.journal(conns, run_id)
    tree = await tree_view(conns, run_id)
    steps = await data.steps(conns, run_id)
    story = await lifecycle(conns, run_id)
    replica = await _replica(conns)
    timeline = svg.timeline(journal.entries, explanation.now_ms, detail.run.status.terminal)
    done = request.query_params.get("done")
    return _page(
        request,
        "run",
        replica=replica,
        detail=detail,
        explanation=explanation,
        journal=journal,
        tree=tree,
        steps=steps,
        story=story,
        timeline=timeline,
        done=done if done in _DONE_WORDS else None,
        done_words=_DONE_WORDS,
        actions=fitting(detail.run),
    )


@_answers
async def fleet(request: Request) -> Response:
    conns = _dash(request).conns
    now = await conns.store.stats.now_ms()
    view, problem = await data.fleet(conns, now)
    replica = await _replica(conns)
    if request.url.path.startswith("/api/"):
        if view is None:
            return JSONResponse({"error": problem}, status_code=503)
        return _json(_stamped(view, replica))
    running = await conns.store.inspect.list_runs(status=RunStatus.RUNNING, limit=data.COUNT_CAP)
    owned: dict[str, list[str]] = {}
    for row in running:
        if row.owner is not None:
            owned.setdefault(row.owner.key, []).append(row.id)
    hosts: dict[str, list[Any]] = {}
    for w in view.workers if view else []:
        hosts.setdefault(w.host, []).append(w)
    return _page(
        request, "fleet", replica=replica, view=view, problem=problem, hosts=hosts, owned=owned
    )


# ---- the run's JSON pieces (the CLI's --json answers) ------------------------------


@_answers
async def api_run(request: Request) -> Response:
    run_id, part = api_id(request)
    conns = _dash(request).conns
    answer: ReadAnswer
    match part:
        case "":
            answer = await detail_view(conns, run_id)
        case "explain":
            answer = explain(await gather(conns, run_id))
        case "journal":
            answer = await data.journal(conns, run_id)
        case "tree":
            answer = await tree_view(conns, run_id)
        case "steps":
            answer = await data.steps(conns, run_id)
        case "lifecycle":
            answer = await lifecycle(conns, run_id)
        case _:
            return JSONResponse({"error": "no such part"}, status_code=404)
    return _json(_stamped(answer, await _replica(conns)))


# ---- buttons -----------------------------------------------------------------------

_DONE_WORDS = {
    "requested": "cancellation requested: the owner (or a sweep) closes the run as cancelled",
    "already-requested": "cancellation was already requested",
    "already-terminal": "nothing to cancel: the run has already settled",
    "approved": "approved",
    "denied": "denied",
    "resumed": "resumed: released from quarantine, or moved on from dead",
    "retried": "retried: this round runs the failed run again",
    "completed": "completed",
    "already-completed": "already completed",
}


FORM_MAX = 64 * 1024


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form (what the pages send), bounded; no multipart parser needed."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX:
            raise c.UserError(f"form larger than {FORM_MAX} bytes")
    fields = parse_qs(body.decode(errors="replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in fields.items()}


@_answers
async def act(request: Request) -> Response:
    run_id, name = action_id(request)
    try:
        action = Action(name)
    except ValueError:
        words = f"no action {name!r}" if name else "a button's address ends in its action"
        return _problem(request, 404, f"{words}: /runs/<id>/<action>")
    form = await _form(request)
    why = security.refusal(request, form.get(security.FIELD))
    if why is not None:
        return _problem(request, 403, why)
    result = await perform(_dash(request).queue, action, run_id, form)
    if "application/json" in request.headers.get("accept", ""):
        return _json(result)
    outcome = getattr(result, "outcome", None) or getattr(result, "action", "")
    shown = result.run_id if isinstance(result, AnswerResult) else run_id  # a retry's round
    return RedirectResponse(run_url(shown, done=outcome), status_code=303)


def create_app(
    settings: Settings,
    *,
    scopes: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1"),
) -> Starlette:
    """The app; its connections open at startup (lifespan) and close at shutdown.

    Pages read through ``conns`` (RUNFLEET_READ_DATABASE_URL when set: a replica);
    actions go through the queue, on RUNFLEET_DATABASE_URL, which decides.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with (
            c.connect(settings, redis="optional", read=True) as conns,
            AsyncQueue("default", settings=settings, scopes=scopes) as q,
        ):
            app.state.dash = Dashboard(conns, q, data.JournalTail(), scopes)
            yield

    routes = [  # a run's address: ops.dashboard.urls
        Route("/", overview),
        Route("/runs", runs),
        Route("/runs/{rest:path}", run, methods=["GET"]),
        Route("/runs/{rest:path}", act, methods=["POST"]),
        Route("/run", run, methods=["GET"]),
        Route("/run/{action}", act, methods=["POST"]),
        Route("/fleet", fleet),
        Route("/api/overview", overview),
        Route("/api/runs", runs),
        Route("/api/runs/{rest:path}", api_run),
        Route("/api/run", api_run),
        Route("/api/run/{part}", api_run),
        Route("/api/fleet", fleet),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
