"""The vocabulary of durable flows: retry policy, handoff, decisions, and control exceptions.

``Suspended`` and ``Interrupted`` are BaseExceptions so that a flow's own ``except
Exception`` cannot swallow them; ``Cause`` says why an ``Interrupted`` stops a run.
"""

from __future__ import annotations

import enum
import random
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tenacity import RetryCallState, retry_if_exception_type, wait_exponential

from runfleet.declaration.names import importable_name
from runfleet.store.errors import InvalidInput, RunfleetError
from runfleet.store.steps import StepRecord


class NonDeterminism(RunfleetError):
    """A resumed body made a different durable call than the one recorded at that position."""

    def __init__(self, position: int, recorded: str, attempted: str) -> None:
        super().__init__(
            f"non-deterministic flow: call #{position} was recorded as {recorded!r} "
            f"but this execution attempted {attempted!r}"
        )
        self.position = position
        self.recorded = recorded
        self.attempted = attempted


class WaitTimeout(RunfleetError, TimeoutError):
    """A ``wait_for`` or ``approval`` reached its timeout without an answer."""


class ChildFailed(RunfleetError):
    """An attached child ended failed or cancelled; ``status`` and ``error`` say how."""

    def __init__(self, child_id: str, status: str, error: Any) -> None:
        super().__init__(f"child run {child_id!r} ended {status}: {error}")
        self.child_id = child_id
        self.status = status
        self.error = error


@dataclass(frozen=True, slots=True)
class Call:
    """One durable call's place in the run's history (``Context._next``): its position,
    its key (``kind:name#n``, the n-th such call), and the record a replay returns (None:
    a new call, run and recorded now)."""

    position: int
    key: str
    record: StepRecord | None


class Cause(enum.StrEnum):
    """Why a run stopped executing in this process before its body ended.

    A StrEnum: its values are the stable strings the journal records and the metrics
    labels carry, and mypy proves every ``match`` over it handles every case.
    """

    CANCELLED = "cancelled"
    """A cancel request: compensations run, then the run settles cancelled."""
    LOST_FENCE = "lost-fence"
    """Another owner holds the run: this process writes nothing more for it."""
    LEASE_LAPSED = "lease-lapsed"
    """This process could not confirm its lease in time: the run is handed back."""
    SHUTDOWN = "shutdown"
    """The worker is stopping: the run is handed back (released), not cancelled."""
    DRIVE_FAILED = "drive-failed"
    """The drive itself failed after activation: the run is handed back at once."""
    INFRA_UNAVAILABLE = "infra-unavailable"
    """runfleet's own store call gave up (an outage, not the flow): handed back."""


class Interrupted(BaseException):
    """Raised into a flow whose run this process must stop executing.

    ``cause`` (``Cause``) is ``cancelled`` (commit ``cancelled``),
    ``lost-fence`` (another owner holds the run: write nothing), or one that releases
    the run so another worker resumes it (``lease-lapsed``, ``shutdown``...).
    """

    def __init__(self, cause: Cause) -> None:
        super().__init__(cause)
        self.cause = cause


class Suspended(BaseException):
    """The run parked durably; the body stops here and resumes by replay later.

    A BaseException so that a flow's own ``except Exception`` cannot swallow it.
    """


@dataclass(frozen=True)
class Retry:
    """How often a failing step is tried again, and how long to wait between tries.

    ``backoff`` and ``max_backoff`` shape an exponential wait (tenacity computes
    it); ``retry_on`` limits which exceptions are retried at all.
    """

    attempts: int = 3
    backoff: float = 0.5
    max_backoff: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    jitter: float = 0.1
    park_over: float | None = None
    """A wait longer than this many seconds parks the run on a durable timer (freeing its
    slot); a shorter one is slept in-process. None: ``RUNFLEET_PARK_BACKOFF_OVER``."""

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        if attempt >= self.attempts:
            return False
        state = _state(attempt)
        state.outcome = _Failed(exc)  # type: ignore[assignment]  # tenacity's outcome is a Future; _Failed is the duck it reads
        return bool(retry_if_exception_type(self.retry_on)(state))

    def delay(self, attempt: int) -> float:
        base = wait_exponential(multiplier=self.backoff, max=self.max_backoff)(_state(attempt))
        return float(base) * (1 + random.uniform(0, self.jitter))


class _Failed:
    """The slice of a tenacity Future its exception predicates read."""

    def __init__(self, exc: BaseException) -> None:
        self._exc = exc
        self.failed = True

    def exception(self) -> BaseException:
        return self._exc


def _state(attempt: int) -> RetryCallState:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]  # tenacity's RetryCallState wants a Retrying; its stop/wait read none
    state.attempt_number = attempt
    return state


NO_RETRY = Retry(attempts=1)


@dataclass(frozen=True)
class Handoff:
    """Returned by a flow: settle this round and continue the lineage in a new one.

    ``args`` a tuple or list, ``kwargs`` a dict with str keys, ``deadline`` a datetime or
    None; anything else fails the round with ``InvalidHandoff`` (``checked_handoff``).
    """

    flow: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    deadline: datetime | None = None
    """The next round's deadline; when None, the target flow's ``timeout`` from now."""


class InvalidHandoff(InvalidInput):
    """A flow returned a ``Handoff`` no next round can be made from: the round fails with
    this, once (``round-invalid``). ``field`` names the part: ``args``, ``kwargs``,
    ``deadline`` (an unknown or unimportable ``flow`` is ``InvalidInput("flow")``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"Handoff.{field}", problem)  # the message: "invalid Handoff.args: …"
        self.field = field


@dataclass(frozen=True)
class HandoffCall:
    """What a ``Handoff`` admits its next round with, once checked (``checked_handoff``)."""

    args: list[Any]
    kwargs: dict[str, Any]
    deadline_ms: int | None
    """The explicit deadline in epoch ms; None: the target flow's ``timeout`` applies."""


def checked_handoff(handoff: Handoff) -> HandoffCall:
    """The next round's arguments and deadline; ``InvalidHandoff`` naming the bad field.

    A flow's return value is data the type checker may never have seen (an untyped body,
    ``Handoff(next, 5)``): checked where the round is settled, so a malformed one fails
    the run once instead of escaping the settlement and re-running the body on every
    re-drive. A string is refused as ``args`` although it is a sequence: ``"ab"`` would
    become two arguments.
    """
    args, kwargs, deadline = handoff.args, handoff.kwargs, handoff.deadline
    if not isinstance(args, tuple | list):
        raise InvalidHandoff(
            "args", f"expected a tuple or list of positional arguments, got {_shown(args)}"
        )
    if not isinstance(kwargs, dict):
        raise InvalidHandoff(
            "kwargs", f"expected a dict of keyword arguments, got {_shown(kwargs)}"
        )
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        raise InvalidHandoff("kwargs", f"keyword names must be str, got {_shown(bad_keys[0])}")
    if deadline is None:
        return HandoffCall(list(args), dict(kwargs), None)
    if not isinstance(deadline, datetime):
        raise InvalidHandoff("deadline", f"expected a datetime or None, got {_shown(deadline)}")
    try:
        deadline_ms = int(deadline.timestamp() * 1000)
    except (OverflowError, ValueError, OSError) as exc:
        raise InvalidHandoff("deadline", f"{deadline!r} has no timestamp: {exc}") from None
    return HandoffCall(list(args), dict(kwargs), deadline_ms)


def _shown(value: object) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


@dataclass(frozen=True)
class Decision:
    """A human's answer to ``ctx.approval``; truthy when approved."""

    approved: bool
    value: Any = None
    actor: str | None = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.approved


def reference(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function, so another process can import it."""
    name = importable_name(fn)
    if name is None:
        raise RunfleetError(f"{fn!r} must be a module-level function to be durable")
    return name
