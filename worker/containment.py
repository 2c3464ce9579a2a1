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
the loop. Signals are not exceptions here: the worker handles SIGTERM/SIGINT on the loop
(``worker.supervisor``), so a ``KeyboardInterrupt`` inside a run is always the run's own.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any

from runfleet.store.errors import RunfleetError

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
