"""The flow registry: ``@flow`` on async or sync functions, and plain functions as flows.

A flow is addressed by name. ``@flow`` names it explicitly (default: the
function's ``module:qualname``); a plain function enqueued rq-style is an implicit
single-step flow named ``module:qualname``. Only registered code runs: a plain
function resolves only if its module is one that registers this worker's flows (its
``--flows`` modules) or matches an ``--allow-import`` prefix, whatever a producer or
the database names; nothing else is ever imported.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import MethodType, ModuleType
from typing import Any, Literal, overload

from runfleet.declaration import FlowDeclaration, check_signature
from runfleet.declaration.names import load_from_path, qualified_name
from runfleet.store import validate
from runfleet.store.errors import InvalidInput, UnknownFlow
from runfleet.store.schedules import ScheduleSpec, for_flow
from runfleet.worker import instances
from runfleet.worker.versions import declared as declared_version

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
_FLOW_MODULES: set[str] = set()
"""Modules that registered a flow, plus the worker's ``--flows`` modules."""
_PREFIXES: tuple[str, ...] | None = None
"""``--allow-import`` prefixes; None until a worker configures them (then the
``RUNFLEET_ALLOW_IMPORT`` environment variable decides)."""


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
    code may take (``worker.versions``, docs/lifecycle.md). ``max_recoveries``: this
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
        _FLOW_MODULES.add(target.__module__)
        return registered

    return register(fn) if fn is not None else register


def registered() -> dict[str, Flow]:
    return dict(_REGISTRY)


_RESOLVED: set[str] = set()
"""Plain ``module:function`` names this process has resolved (``runnable``)."""
RESOLVED_KEPT = 10_000


def runnable() -> set[str]:
    """The flow names this process is known to run: its registered flows and the plain
    functions it has resolved so far. A claim's priority look-ahead takes a run in another
    run's place only among these (docs/queues.md), so it never activates one it cannot run.
    A versioned flow is left out: whether this process may run one of its runs depends on
    the run's version, which only the usual read-then-decide path checks (docs/lifecycle.md).
    A class-bound flow is left out for the same reason (its run's instance is read first)."""
    return {name for name, f in _REGISTRY.items() if f.version is None and f.owner is None} | set(
        _RESOLVED
    )


def allow_imports(modules: Iterable[str], prefixes: Iterable[str]) -> None:
    """What this worker may run besides registered flows: plain functions of its
    ``--flows`` modules and of modules under ``prefixes`` (``--allow-import``)."""
    global _PREFIXES
    _FLOW_MODULES.update(modules)
    _PREFIXES = tuple(p.strip().rstrip(".") for p in prefixes if p.strip())


def load_flows(modules: Sequence[str], prefixes: Iterable[str]) -> None:
    """Import the ``--flows`` modules (their ``@flow`` decorators register this worker's
    flows; a module that fails to import stops the worker), then ``allow_imports``."""
    for name in modules:
        importlib.import_module(name)
    allow_imports(modules, prefixes)


def import_prefixes() -> list[str]:
    """The ``--allow-import`` prefixes in force (else ``RUNFLEET_ALLOW_IMPORT``'s)."""
    if _PREFIXES is not None:
        return list(_PREFIXES)
    env = os.environ.get("RUNFLEET_ALLOW_IMPORT", "")
    return [p.strip().rstrip(".") for p in env.split(",") if p.strip()]


def flow_modules() -> list[str]:
    """The modules whose plain functions run here: ``--flows`` ones and those that
    registered a flow."""
    return sorted(_FLOW_MODULES)


def import_allowed(module_name: str) -> bool:
    """Whether a plain function of ``module_name`` may run in this worker."""
    if module_name in _FLOW_MODULES:
        return True
    prefixes = _PREFIXES if _PREFIXES is not None else import_prefixes()
    return any(module_name == p or module_name.startswith(p + ".") for p in prefixes)


_IMPORT_FAILED: dict[str, str] = {}
"""Allowed modules whose import raised, and what it raised (``Type: message``)."""
IMPORT_FAILURES_KEPT = 1_000


def import_failure(module_name: str) -> str | None:
    """What importing ``module_name`` raised in this process the last time it was tried;
    None if it never failed or was imported since."""
    return _IMPORT_FAILED.get(module_name)


def _allowed_module(module_name: str) -> ModuleType | None:
    if not import_allowed(module_name):
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that fails to import names nothing runnable
        _import_failed(module_name, exc)
        return None
    _IMPORT_FAILED.pop(module_name, None)
    return module


def _import_failed(module_name: str, exc: Exception) -> None:
    """One line per module and failure: each run of it tries the import again, and a
    traceback per run (every lost-wake sweep) would bury everything else in the log.
    The line names the module, the error and where it was raised (the innermost frame,
    for an error inside the module's own code)."""
    error = f"{type(exc).__name__}: {exc}"
    if _IMPORT_FAILED.get(module_name) == error:
        return
    if len(_IMPORT_FAILED) >= IMPORT_FAILURES_KEPT:
        _IMPORT_FAILED.clear()  # bounded memory; a repeated line now and then is fine
    _IMPORT_FAILED[module_name] = error
    fields = {"module_name": module_name, "error": error}
    frames = [  # the module's own code: not this function's frame, nor the import machinery
        f
        for f in traceback.extract_tb(exc.__traceback__)[1:]
        if not f.filename.startswith("<frozen") and f"{os.sep}importlib{os.sep}" not in f.filename
    ]
    if isinstance(exc, SyntaxError) and exc.filename:
        fields["raised_at"] = f"{exc.filename}:{exc.lineno}"
    elif frames:
        fields["raised_at"] = f"{frames[-1].filename}:{frames[-1].lineno}"
    log.warning("flow.import_failed", extra=fields)


def resolve(name: str, *, allow_import: bool = True) -> Flow:
    """The flow called ``name``: registered, or an allowed plain ``module:function``.

    Raises UnknownFlow for anything else (the caller leaves the run unclaimed and logs
    ``run.unknown_flow``): a module outside ``--flows``/``--allow-import``, a builtin
    (``os:system``), a class, a function re-exported from another module.
    """
    found = _REGISTRY.get(name)
    if found is not None:
        return found
    if not allow_import or ":" not in name:
        raise UnknownFlow(name, "not registered in this process")
    target = load_from_path(name, _allowed_module)
    if target is None:
        module_name = name.partition(":")[0]
        failed = import_failure(module_name) if import_allowed(module_name) else None
        if failed is not None:
            raise UnknownFlow(name, f"its module {module_name} failed to import: {failed}")
        raise UnknownFlow(
            name,
            "not registered, and not a function of a --flows module or of a module "
            "allowed by --allow-import (RUNFLEET_ALLOW_IMPORT)",
        )
    if isinstance(target, Flow):
        return target
    if len(_RESOLVED) < RESOLVED_KEPT:  # bounded memory: beyond it, no look-ahead to new ones
        _RESOLVED.add(name)
    return Flow(name=name, fn=target, takes_context=False)


def function(reference: str) -> Callable[..., Any]:
    """A compensation's ``module:qualname``, resolved by the same rule as a plain flow."""
    target = load_from_path(reference, _allowed_module)
    if target is None or isinstance(target, Flow):
        raise UnknownFlow(reference, "not a function of a --flows or --allow-import module")
    return target  # type: ignore[no-any-return]  # load_from_path answers Any: a non-Flow callable here
