"""``@flow`` on async or sync functions, and the flows this process declared by name.

A flow is addressed by name. ``@flow`` names it explicitly (default: the function's
``module:qualname``) and records it here; which names a worker runs, and which plain
functions besides, is the worker's resolver (``worker.resolver``): only registered code
runs, whatever a producer or the database names.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MethodType
from typing import Any, Literal, overload

import runfleet.worker.authoring.instances as instances
from runfleet.declaration import FlowDeclaration, check_signature
from runfleet.declaration.names import qualified_name
from runfleet.store import validate
from runfleet.store.errors import InvalidInput
from runfleet.store.schedules import ScheduleSpec, for_flow
from runfleet.worker.authoring.versions import declared as declared_version

log = logging.getLogger("runfleet.worker.flows")

NEVER: Literal["never"] = "never"
"""``@flow(max_recoveries=NEVER)``: the flow's runs are never parked dead."""


@dataclass(frozen=True)
class Flow(FlowDeclaration):
    """A registered flow: its declaration (``runfleet.declaration``, what producers read),
    how to call it, and what only workers read (schedule, compatible versions, recoveries)."""

    fn: Callable[..., Any]
    queue: str = "default"
    schedule: ScheduleSpec | None = None
    """Periodic runs (``@flow(schedule=...)``); workers write it at start (worker/scheduler.py)."""
    compatible: tuple[str, ...] = ()
    """Earlier versions whose runs this code can replay (with ``ctx.patched``)."""
    max_recoveries: int | Literal["never"] | None = None
    """Takeovers after lost processes in a row before a run is parked dead (the fleet's
    ``RUNFLEET_MAX_RECOVERIES`` when None; ``NEVER``: never dead-lettered)."""

    def __set_name__(self, owner: type, attribute: str) -> None:
        """A ``@flow`` in a ``FlowInstance`` class's body becomes a class-bound flow."""
        if not instances.binds(owner):
            return
        if self.schedule is not None:
            if _REGISTRY.get(self.name) is self:  # refused: no worker may schedule it
                del _REGISTRY[self.name]
            raise InvalidInput(
                "schedule", f"{self.name!r} is class-bound: a schedule names no instance"
            )
        bound = replace(self, owner=owner)
        if _REGISTRY.get(self.name) is self:
            _REGISTRY[self.name] = bound
        setattr(owner, attribute, bound)

    def __get__(self, obj: object, objtype: type | None = None) -> Flow:
        """``instance.method``: this flow bound to that instance (the class: unbound)."""
        if obj is None or self.owner is None or not isinstance(obj, instances.FlowInstance):
            return self
        return self.bound_to(obj)

    def bound_to(self, obj: instances.FlowInstance) -> Flow:
        """This class-bound flow calling ``fn`` on ``obj``, admitted for its name."""
        return replace(
            self,
            fn=MethodType(self.fn, obj),
            instance=obj.instance_name,
            instance_scopes=obj.scopes,
        )

    def accepts(self, version: str | None) -> bool:
        """Whether this code may run a run admitted with ``version`` (None: any code)."""
        if self.version is None or version is None:
            return True
        return version == self.version or version in self.compatible

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling a flow object directly runs the plain function (handy in unit tests)."""
        return self.fn(*args, **kwargs)


_REGISTRY: dict[str, Flow] = {}
_DECLARING_MODULES: set[str] = set()
"""Modules that registered a flow (their plain functions may run too: ``worker.resolver``)."""


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
    priority: int | None = None,
    version: str | None = None,
    compatible: Sequence[str] = (),
    max_recoveries: int | Literal["never"] | None = None,
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
    priority: int | None = None,
    version: str | None = None,
    compatible: Sequence[str] = (),
    max_recoveries: int | Literal["never"] | None = None,
) -> Flow | Callable[[Callable[..., Any]], Flow]:
    """Register ``fn`` as a flow; usable as ``@flow`` or ``@flow(name=..., queue=...)``.

    ``schedule`` (a cron expression in ``timezone``) also runs it periodically, called
    with ``schedule_kwargs``; a bad expression, time zone, policy or argument raises
    ``InvalidSchedule`` / ``InvalidInput`` here, at import (docs/how-to/schedules.md).
    ``version`` (or ``"auto"``: a digest of the code) and ``compatible``: which runs this
    code may take (``versions``, docs/explanation/lifecycle.md). ``max_recoveries``: this
    flow's own poison-run limit (``NEVER``: never parked dead; docs/how-to/failure-handling.md).
    """
    if max_recoveries is not None and max_recoveries != NEVER:
        validate.count("max_recoveries", max_recoveries)

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
            priority=None if priority is None else validate.priority(priority),
            version=declared_version(target, version),
            compatible=tuple(validate.identifier("compatible", v) for v in compatible),
            max_recoveries=max_recoveries,
        )
        existing = _REGISTRY.get(registered.name)
        if existing is not None and existing.fn is not target:
            log.warning("flow.reregistered", extra={"flow": registered.name})
        _REGISTRY[registered.name] = registered
        _DECLARING_MODULES.add(target.__module__)
        return registered

    return register(fn) if fn is not None else register


def registered() -> dict[str, Flow]:
    """Every flow this process declared, by name."""
    return dict(_REGISTRY)


def declared_flow(name: str) -> Flow | None:
    """The flow this process declared as ``name`` (None: none of that name)."""
    return _REGISTRY.get(name)


def declaring_modules() -> set[str]:
    """The modules that registered a flow in this process."""
    return set(_DECLARING_MODULES)
