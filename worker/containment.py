"""What a run's own code may raise, and how runfleet keeps it inside that run.

Python lets user code raise any ``BaseException``, and asyncio gives three of them a
meaning for the whole process: ``SystemExit`` and ``KeyboardInterrupt`` raised in a task
are re-raised out of the event loop (the worker would end, its other runs orphaned), and a
``CancelledError`` ends its task as "cancelled" (the driver would take it for a shutdown
and release the run, to be re-run for ever). So every call into user code — the body, a
step function, an rq callback, a compensation — is made inside a boundary that turns a
BaseException runfleet did not raise into ``UserBaseException``, an ordinary exception
that fails that run with the original's type recorded. Runfleet's own control exceptions
(``Interrupted``, ``Suspended``, a cancellation it asked for) pass through unchanged; the
context that raised them tells them apart (``Context.raised_by_runfleet``).

Tasks a body creates are covered by a task factory (``contain_tasks``): their
``SystemExit`` / ``KeyboardInterrupt`` end the task with ``UserBaseException`` instead of
the loop. Callbacks it schedules on the loop (``loop.call_soon(sys.exit, 7)``, ``call_later``,
``call_at``, ``call_soon_threadsafe``) are covered by ``contain_callbacks``: their
``SystemExit`` / ``KeyboardInterrupt`` fails the run that scheduled them (its task is
stopped and ends with ``UserBaseException``), or, the run already over, is logged and
dropped; the loop goes on. Signals are not exceptions here: the worker handles SIGTERM/SIGINT
on the loop (``worker.stopping``), so a ``KeyboardInterrupt`` inside a run is always the run's
own.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from runfleet.store.errors import RunfleetError

log = logging.getLogger("runfleet.worker.containment")

_IN_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "runfleet_in_run", default=None
)
"""The run whose code the current task executes (tasks a body creates inherit it)."""


class UserBaseException(RunfleetError):
    """A ``BaseException`` (not an ``Exception``) raised by a run's own code.

    It fails that run and nothing else: the run's error names ``original``'s type
    (``SystemExit``, ``KeyboardInterrupt``, ``CancelledError``, ``GeneratorExit``, a
    class of the user's own) with its message and traceback (``worker.settle.error_of``).
    """

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__} raised by the run's own code")
        self.original = original


def safe_str(value: object, *, use_repr: bool = False) -> str:
    """``str`` (or ``repr``) of a value the run's code made, whatever its method raises.

    A hostile ``__str__`` may raise anything, ``SystemExit`` included; that must not stop
    the run from failing, nor the worker.
    """
    try:
        return repr(value) if use_repr else str(value)
    except BaseException:  # synchronous user code: there is no cancellation to keep
        return f"<{type(value).__name__} whose {'repr' if use_repr else 'str'}() raised>"


def running(run_id: str) -> contextvars.Token[str | None]:
    """Mark the current task (and the tasks it creates) as executing ``run_id``'s code."""
    return _IN_RUN.set(run_id)


def done_running(token: contextvars.Token[str | None]) -> None:
    """Undo ``running``. A coroutine closed outside its task (a pending task collected at
    shutdown) runs its ``finally`` in another context, where the token cannot be reset:
    the task's own context copy, which holds the mark, dies with the task anyway."""
    try:
        _IN_RUN.reset(token)
    except ValueError:
        pass


def closed_from_outside(exc: BaseException, run_id: str) -> bool:
    """Whether ``exc`` is the ``GeneratorExit`` that ``close()`` threw into ``run_id``'s code.

    A pending run task collected at shutdown has its coroutine closed by the garbage
    collector, outside the task: Python throws ``GeneratorExit`` in at the await point and
    requires it back (anything else is "Exception ignored in <coroutine>"). That is not the
    run's code raising one, which can happen only while the run's own task (or a task it
    created) executes, in the context that carries the ``running`` mark; a close runs in
    whatever context the collector interrupted, without this run's mark.
    """
    return isinstance(exc, GeneratorExit) and _IN_RUN.get() != run_id


async def _contained(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise UserBaseException(exc) from exc


def contain_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Make tasks created by run code end with ``UserBaseException`` on ``SystemExit`` /
    ``KeyboardInterrupt`` instead of stopping ``loop``.

    Installed once per worker process; a task factory already set is kept and called
    with the wrapped coroutine. Tasks created outside any run are left untouched.
    """
    previous = loop.get_task_factory()
    if getattr(previous, "runfleet_contains", False):
        return

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        context = kwargs.get("context")
        run_id = _IN_RUN.get() if context is None else context.get(_IN_RUN)
        if run_id is not None and asyncio.iscoroutine(coro):
            coro = _contained(coro)
        if previous is not None:
            return previous(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    factory.runfleet_contains = True  # type: ignore[attr-defined]  # a marker attribute on the task factory function
    loop.set_task_factory(factory)


_TASKS: dict[str, asyncio.Task[Any]] = {}
"""Each executing run's task, while its body runs (``watch``/``unwatch``)."""
_ESCAPED: dict[str, BaseException] = {}
"""The first ``SystemExit`` / ``KeyboardInterrupt`` a run's loop callback raised."""


def watch(run_id: str, task: asyncio.Task[Any]) -> None:
    """``task`` executes ``run_id``'s body: a callback of the run that exits stops it."""
    _TASKS[run_id] = task
    _ESCAPED.pop(run_id, None)


def unwatch(run_id: str) -> None:
    _TASKS.pop(run_id, None)
    _ESCAPED.pop(run_id, None)


def escaped(run_id: str) -> BaseException | None:
    """What a loop callback of ``run_id``'s code raised to end the process, if anything."""
    return _ESCAPED.get(run_id)


def _escape(run_id: str, exc: BaseException) -> None:
    task = _TASKS.get(run_id)
    live = task is not None and not task.done()
    log.warning(
        "run.callback_exit",
        extra={"run_id": run_id, "exception": type(exc).__name__, "run_live": live},
    )
    if task is not None and live:
        _ESCAPED.setdefault(run_id, exc)
        task.cancel(msg="a loop callback of the run's code raised " + type(exc).__name__)


def _guarded(callback: Callable[..., object], run_id: str) -> Callable[..., object]:
    def call(*args: object) -> object:
        try:
            return callback(*args)
        except (SystemExit, KeyboardInterrupt) as exc:
            _escape(run_id, exc)
            return None

    return call


def contain_callbacks(loop: asyncio.AbstractEventLoop) -> None:
    """Make callbacks scheduled by run code unable to stop ``loop`` with ``SystemExit`` /
    ``KeyboardInterrupt`` (the loop re-raises those two out of ``run_forever``: the worker
    ended, its runs left ``running`` until stale). Callbacks scheduled outside any run
    are left untouched; the loop's own (in C, under uvloop) never pass through here.
    """
    if getattr(loop, "runfleet_contains_callbacks", False):
        return
    # Instance attributes shadow the loop's methods (uvloop's Loop takes them too).
    for name in ("call_soon", "call_soon_threadsafe"):
        setattr(loop, name, _soon(getattr(loop, name)))
    for name in ("call_later", "call_at"):
        setattr(loop, name, _timed(getattr(loop, name)))
    setattr(loop, "runfleet_contains_callbacks", True)  # noqa: B010 - a marker, not an API


def _soon(schedule: Callable[..., Any]) -> Callable[..., Any]:
    def soon(callback: Callable[..., object], *args: Any, context: Any = None) -> Any:
        run_id = _IN_RUN.get()
        if run_id is not None:
            callback = _guarded(callback, run_id)
        return schedule(callback, *args, context=context)

    return soon


def _timed(schedule: Callable[..., Any]) -> Callable[..., Any]:
    def timed(when: float, callback: Callable[..., object], *args: Any, context: Any = None) -> Any:
        run_id = _IN_RUN.get()
        if run_id is not None:
            callback = _guarded(callback, run_id)
        return schedule(when, callback, *args, context=context)

    return timed
