"""A producer's handle on one run (``AsyncRun``) and how a settled run answers ``wait``.

A completed run answers with its result, a cancelled one raises ``RunCancelled``, a
failed one ``RunFailed`` and one parked dead ``RunDead`` (a ``RunFailed``, at once); a run
that handed off answers with the last round of its lineage. Every read goes through
``AsyncQueue.authorized``, so a handle never shows a run the producer's scopes do not
cover.
"""

from __future__ import annotations

import builtins
import math
import textwrap
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from runfleet.broker.notify import Notifier, SettledMark
from runfleet.producer.session import ProducerSession
from runfleet.store.errors import InvalidInput, RunfleetError
from runfleet.store.types import (
    CancelOutcome,
    JsonValue,
    RunError,
    RunRow,
    RunStatus,
    WaitingReason,
)


class RunSource(Protocol):
    """What a run handle asks of the queue it came from (``AsyncQueue``)."""

    @property
    def session(self) -> ProducerSession: ...

    @property
    def notifier(self) -> Notifier: ...

    async def authorized(self, run_id: str) -> RunRow:
        """The run's row, if the producer's scopes cover it."""
        ...

    async def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome: ...


class RunFailed(RunfleetError):
    """The run settled ``failed``; it reads as the run's own error, first line ``Type: message``.

    ``exc_type``, ``exc_message`` and ``remote_traceback`` are what the worker recorded
    (``error`` is the whole record, a ``RunError``). A run that raised a builtin exception
    raises here as an instance of that type too (``except ValueError`` catches it, as DBOS
    re-raises the workflow's own error); every failure is a ``RunFailed``. Only builtins are used: a
    type named by a row is never imported (docs/explanation/trust-model.md).
    """

    error: RunError | None

    def __new__(cls, run_id: str, error: RunError | None) -> RunFailed:
        if cls is RunFailed:
            cls = _with_builtin(error or RunError())
        return super().__new__(cls, run_id, error)

    def __init__(self, run_id: str, error: RunError | None) -> None:
        record = error or RunError()
        self.run_id = run_id
        self.error = error
        self.exc_type: str | None = record.type or None
        self.exc_module: str | None = record.module or None
        self.exc_message: str = record.message or ""
        self.remote_traceback: str | None = record.traceback or None
        self._text = self._describe()
        super().__init__(self._text)

    def __str__(self) -> str:
        return self._text  # not KeyError's repr of its argument, nor OSError's errno form

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunFailed, (self.run_id, self.error))

    def _describe(self) -> str:
        if self.exc_type:
            head = f"{self.exc_type}: {self.exc_message}" if self.exc_message else self.exc_type
        elif self.error is None:
            head = "the run failed with no error recorded"
        else:
            head = str(self.error.to_json())  # no type recorded: the object as stored
        tail = f"run {self.run_id!r} failed"
        if self.remote_traceback:
            trace = textwrap.indent(self.remote_traceback.rstrip("\n"), "    ")
            tail += f"; its traceback on the worker:\n{trace}"
        return f"{head}\n{tail}"


_UNMIXED = (StopIteration, StopAsyncIteration)  # generators turn these into RuntimeError
_MIXED: dict[type[Exception], type[RunFailed]] = {}


def _with_builtin(record: RunError) -> type[RunFailed]:
    """``RunFailed`` mixed with the builtin exception type the run raised, if it was one.

    A record without ``module`` (written before the worker recorded it) is taken as a
    builtin when its type name is one; a builtin that needs more than a message to be
    made (``UnicodeDecodeError``) stays a plain ``RunFailed``."""
    name, module = record.type, "builtins" if record.module is None else record.module
    if name is None or module != "builtins" or name.startswith("_"):
        return RunFailed
    builtin = getattr(builtins, name, None)
    if (
        not isinstance(builtin, type)
        or not issubclass(builtin, Exception)
        or issubclass(builtin, _UNMIXED)
    ):
        return RunFailed
    mixed = _MIXED.get(builtin)
    if mixed is None:
        try:
            mixed = type("RunFailed", (RunFailed, builtin), {"__module__": __name__})
            mixed(run_id="probe", error=RunError(type=name))
        except Exception:  # a layout or constructor that cannot take a message alone
            mixed = RunFailed
        _MIXED[builtin] = mixed
    return mixed


class RunDead(RunFailed):
    """The run is parked ``dead``: its executions kept ending in a lost process until the
    recovery limit (docs/how-to/failure-handling.md). Nothing moves it but a resume
    (``q.resume_run(run_id)``) or a cancel, so waiting for it is pointless: ``wait``
    raises this at once. A ``RunFailed``, so code written for a failed run handles it;
    ``evidence`` is the wait's request (recoveries, the limit, the owners lost), and
    ``error`` None: the run raised nothing."""

    def __init__(self, run_id: str, evidence: JsonValue) -> None:
        RunfleetError.__init__(
            self, f"run {run_id!r} is parked dead (recovery limit reached): resume or cancel it"
        )
        self.run_id = run_id
        self.error = None
        self.evidence = evidence
        self.exc_type, self.exc_module, self.exc_message = None, None, ""
        self.remote_traceback = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunDead, (self.run_id, self.evidence))


def is_dead(row: RunRow) -> bool:
    """A run parked ``dead`` (not terminal: a resume moves it on)."""
    return row.waiting is not None and row.waiting.reason == WaitingReason.DEAD


class RunCancelled(RunfleetError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled")
        self.run_id = run_id


class AsyncRun:
    """A handle on one run: id, status, ``wait`` for the outcome, ``return_value``, cancel."""

    def __init__(
        self,
        queue: RunSource,
        run_id: str,
        *,
        created: bool = False,
        settled_mark: SettledMark | None = None,
    ) -> None:
        """``created``: this handle's admission created the run (not a join of an existing
        one, nor a handle on an id). ``settled_mark``: where the shared settled
        subscription stood before that admission committed (``Notifier.settled_mark``):
        ``wait`` then waits for the run's notice before its first read."""
        self._queue = queue
        self.id = run_id
        self.created = created
        self._settled_mark = settled_mark if created else None

    def __repr__(self) -> str:
        return f"AsyncRun({self.id!r})"

    async def fetch(self) -> RunRow:
        return await self._queue.authorized(self.id)

    async def current(self) -> RunRow:
        """The row that answers for this id now: the run, or the round that resumed it
        (``resume_run``: the id a caller holds is the run it resumed)."""
        return await self._queue.session.answering(self.id)

    async def get_priority(self) -> int:
        """The run's priority as admitted (the call's, the flow's or the queue's default)."""
        return (await self.fetch()).priority

    async def get_dedup_key(self) -> str | None:
        """The ``dedup_key`` the run was admitted with, or None."""
        return (await self.fetch()).dedup_key

    async def get_status(self) -> RunStatus:
        return (await self.current()).status

    async def return_value(self) -> Any:
        """The result if the run completed, else None (rq's meaning; never waits)."""
        row = await self._last_round(await self.fetch())
        return row.result if row.status is RunStatus.COMPLETED else None

    async def wait(self, timeout: float = 30.0) -> Any:
        """Wait until the run settles; its result, or RunFailed / RunCancelled / TimeoutError.

        Woken by the settled notification; polls Postgres as a fallback, so a lost
        notification (or no Redis at all) costs at most one poll interval. ``timeout``
        must be a finite number of seconds (``InvalidInput``: nan or inf never end).
        """
        return await self.wait_open(timeout, seen_open=False)

    async def wait_open(
        self,
        timeout: float,
        *,
        seen_open: bool,
        answering: Callable[[str], Awaitable[RunRow]] | None = None,
    ) -> Any:
        """``wait``. A settled run answers from one read without subscribing, unless the
        subscription is already shared with other waits (then entering it is free, and one
        read after it does). ``seen_open``: no read is made before subscribing (the sync
        ``Job.wait`` has just read the run still open, or found the subscription shared).

        ``answering``: the row that answers for an id (default: the run's last round,
        ``_last_round``; rq's ``Job`` also follows a requeue). When another round answers
        and it is still open, the wait moves to that round's notices.
        """
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise InvalidInput("timeout", f"must be a finite number of seconds >= 0: {timeout!r}")
        deadline = time.monotonic() + timeout
        notifier = self._queue.notifier
        read = answering or self._answering
        if not seen_open and not notifier.settled_shared():
            row = await read(self.id)
            if row.status.terminal or is_dead(row):  # one indexed read, no subscription
                return outcome(row)
        async with notifier.watch_settled(self.id) as watch:
            if watch.caught_up(self._settled_mark):
                # Subscribed since before the run was admitted, nothing forgotten: it has not
                # settled unless its notice came, so the first read waits for it (or for
                # the poll interval). One read a wait instead of two.
                await watch.wait(min(max(0.0, deadline - time.monotonic()), 0.5))
            while True:  # read again once subscribed: a settle in between is not missed
                row = await read(self.id)
                if row.status.terminal or is_dead(row):
                    return outcome(row)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"run {self.id!r} is still {row.status.value}")
                if row.id != self.id:
                    break  # another round answers: its notices, not this id's, end the wait
                await watch.wait(min(remaining, 0.5))
        following = AsyncRun(self._queue, row.id)
        return await following.wait_open(remaining, seen_open=True, answering=answering)

    async def result(self, timeout: float = 30.0) -> Any:
        """``wait(timeout)`` under its first name. The sync ``Job``/``Run`` calls it ``wait``
        (its ``result`` is rq's property, a value); here no rq name competes, so it stays."""
        return await self.wait(timeout)

    async def _answering(self, run_id: str) -> RunRow:
        """The row that answers for ``run_id`` by default: its last round."""
        return await self._last_round(await self._queue.authorized(run_id))

    async def _last_round(self, row: RunRow) -> RunRow:
        """A run that handed off is answered by the last round of its lineage; one that
        was resumed, by the round that resumed it."""
        while True:
            if row.status is RunStatus.COMPLETED and row.handed_off_to:
                row = await self._queue.authorized(row.handed_off_to)
            elif row.status in (RunStatus.FAILED, RunStatus.CANCELLED) and row.resumed_as:
                row = await self._queue.authorized(row.resumed_as)
            else:
                return row

    async def cancel(self, *, actor: str | None = None) -> CancelOutcome:
        return await self._queue.cancel(self.id, actor=actor)


def outcome(row: RunRow) -> Any:
    """What ``wait`` answers for a settled row: its result, or the error it settled with
    (a run parked dead raises ``RunDead``, with the wait's evidence)."""
    if is_dead(row):
        assert row.waiting is not None
        raise RunDead(row.id, row.waiting.request)
    if row.status is RunStatus.COMPLETED:
        return row.result
    if row.status is RunStatus.CANCELLED:
        raise RunCancelled(row.id)
    raise RunFailed(row.id, row.error)
