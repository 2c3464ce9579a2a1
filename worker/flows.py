"""The flow registry: ``@flow`` on async or sync functions, and plain functions as flows.

A flow is addressed by name. ``@flow`` names it explicitly (default: the
function's ``module:qualname``); a plain importable function enqueued rq-style is
an implicit single-step flow named ``module:qualname`` and resolved by import.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from broker.admission import check_signature
from store.errors import UnknownFlow
from store.schedules import ScheduleSpec, for_flow

log = logging.getLogger("runfleet.worker.flows")


@dataclass(frozen=True)
class Flow:
    """A registered flow: how to call it and where its runs are queued by default."""

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    takes_context: bool = True
    max_rounds: int | None = None
    timeout: float | None = None
    schedule: ScheduleSpec | None = None
    """Periodic runs (``@flow(schedule=...)``); workers write it at start (worker/scheduler.py)."""

    @property
    def runfleet_flow(self) -> tuple[str, str]:
        """(name, queue): how producers (``broker.Queue``) recognise a flow without importing us."""
        return self.name, self.queue

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling a flow object directly runs the plain function (handy in unit tests)."""
        return self.fn(*args, **kwargs)


_REGISTRY: dict[str, Flow] = {}


def qualified_name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


@overload
def flow(fn: Callable[..., Any], /) -> Flow: ...


@overload
def flow(
    *,
    name: str | None = None,
    queue: str = "default",
    max_rounds: int | None = None,
    timeout: float | None = None,
    schedule: str | None = None,
    timezone: str = "UTC",
    catch_up: int = 0,
    overlap: str = "allow",
    schedule_kwargs: dict[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Flow]: ...


def flow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = "default",
    max_rounds: int | None = None,
    timeout: float | None = None,
    schedule: str | None = None,
    timezone: str = "UTC",
    catch_up: int = 0,
    overlap: str = "allow",
    schedule_kwargs: dict[str, Any] | None = None,
) -> Flow | Callable[[Callable[..., Any]], Flow]:
    """Register ``fn`` as a flow; usable as ``@flow`` or ``@flow(name=..., queue=...)``.

    ``schedule`` (a cron expression in ``timezone``) also runs it periodically, called
    with ``schedule_kwargs``; a bad expression, time zone, policy or argument raises
    ``InvalidSchedule`` / ``InvalidInput`` here, at import (README "Schedules").
    """

    def register(target: Callable[..., Any]) -> Flow:
        flow_name = name or qualified_name(target)
        spec = None
        if schedule is not None:
            check_signature(target, True, (), dict(schedule_kwargs or {}))
            spec = for_flow(
                flow_name,
                queue,
                schedule,
                timezone,
                kwargs=schedule_kwargs,
                catch_up=catch_up,
                overlap=overlap,
                timeout=timeout,
                max_rounds=max_rounds,
            )
        registered = Flow(
            name=flow_name,
            fn=target,
            queue=queue,
            max_rounds=max_rounds,
            timeout=timeout,
            schedule=spec,
        )
        existing = _REGISTRY.get(registered.name)
        if existing is not None and existing.fn is not target:
            log.warning("flow.reregistered", extra={"flow": registered.name})
        _REGISTRY[registered.name] = registered
        return registered

    return register(fn) if fn is not None else register


def registered() -> dict[str, Flow]:
    return dict(_REGISTRY)


def resolve(name: str, *, allow_import: bool = True) -> Flow:
    """The flow called ``name``: registered, or a plain ``module:function`` imported now.

    Raises UnknownFlow when neither works; the caller leaves the run parked.
    """
    found = _REGISTRY.get(name)
    if found is not None:
        return found
    if not allow_import or ":" not in name:
        raise UnknownFlow(name, "not registered in this process")
    module_name, _, attr = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownFlow(name, str(exc)) from None
    if isinstance(target, Flow):
        return target
    if not callable(target):
        raise UnknownFlow(name, "not callable")
    return Flow(name=name, fn=target, takes_context=False)
