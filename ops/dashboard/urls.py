"""Where a run's pages live: every valid run id as one percent-encoded URL path segment.

A run id is any text of at most 255 characters without C0 controls, DEL or surrogates
(``store.validate.identifier``): it may hold ``/`` (every child is
``<parent>/child:<flow>#<n>``), ``?``, ``#``, ``%``, ``\\``, ``&``, spaces and any other
Unicode. In a link the id is ONE path segment in which everything but letters, digits
and ``-._~@:`` is percent-encoded (UTF-8), so no ``/``, ``?``, ``#`` or ``\\`` (which
browsers read as ``/``) in it can end it early and point the link — or a cancel form —
at another run. The app reads the segments back from the raw path, before anything is
decoded, so ``/api/runs/a%2Fexplain`` is the run ``a/explain`` and
``/api/runs/a/explain`` the explanation of ``a``.

Two ids cannot be a path segment at all: ``.`` and ``..``, which a browser resolves as
"this folder" and "the parent folder" before it sends the request (``%2E`` too). Their
links carry the id in the query string instead (``/run?id=..``), on routes that take
any id the same way.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from starlette.requests import Request

from runfleet.ops.cli.options import UserError

PARTS = ("explain", "journal", "tree", "steps", "lifecycle")
"""The run's JSON pieces under ``/api/runs/<id>/<part>``."""
_SAFE = "@:"
_DOT_SEGMENTS = (".", "..")


def run_url(
    run_id: str, tail: str | None = None, *, api: bool = False, done: str | None = None
) -> str:
    """The run's page (or, with ``tail``, its button's action or its JSON part)."""
    base = "/api/run" if api else "/run"
    query = [("done", done)] if done else []
    if run_id in _DOT_SEGMENTS:
        path = base + (f"/{quote(tail, safe='')}" if tail else "")
        query.insert(0, ("id", run_id))
    else:
        path = f"{base}s/{quote(run_id, safe=_SAFE)}" + (f"/{quote(tail, safe='')}" if tail else "")
    if not query:
        return path
    return path + "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query)


def _raw_segments(request: Request, rest: str) -> list[str]:
    """The still-encoded path segments ``rest`` (a ``{rest:path}`` parameter) came from.

    ``rest`` is decoded, so a ``%2F`` inside an id reads as a ``/`` in it; the raw path
    keeps them apart. The shortest tail of the raw path that decodes to ``rest`` is the
    one (any shorter tail decodes to a shorter text), wherever the app is mounted.
    """
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        segments = raw.decode("latin-1").split("/")
        for k in range(1, len(segments) + 1):
            if unquote("/".join(segments[-k:])) == rest:
                return segments[-k:]
    return [quote(part, safe="") for part in rest.split("/")]  # no raw path: as decoded


def _decoded(segments: list[str]) -> str:
    return unquote("/".join(segments))


def _query_id(request: Request) -> str:
    """The id of the ``/run?id=`` routes, which take any id (the dot ids' links use them)."""
    run_id = request.query_params.get("id")
    if not run_id:
        raise UserError("which run? the id goes in the query: /run?id=<id>")
    return run_id


def page_id(request: Request) -> str:
    """The id of a run page (``/runs/<id>`` or ``/run?id=``)."""
    if "rest" in request.path_params:
        return str(request.path_params["rest"])  # the whole rest: a hand-typed '/' is kept
    return _query_id(request)


def action_id(request: Request) -> tuple[str, str]:
    """(run id, action) of a button's POST: the action is the last raw path segment
    (none: ``""``)."""
    if "rest" not in request.path_params:
        return _query_id(request), str(request.path_params["action"])
    segments = _raw_segments(request, request.path_params["rest"])
    if len(segments) < 2:
        return _decoded(segments), ""
    return _decoded(segments[:-1]), _decoded(segments[-1:])


def api_id(request: Request) -> tuple[str, str]:
    """(run id, part) of ``/api/runs/<id>[/<part>]``: a part is a last raw segment only."""
    if "rest" not in request.path_params:
        return _query_id(request), str(request.path_params.get("part", ""))
    segments = _raw_segments(request, request.path_params["rest"])
    if len(segments) > 1 and _decoded(segments[-1:]) in PARTS:
        return _decoded(segments[:-1]), _decoded(segments[-1:])
    return _decoded(segments), ""
