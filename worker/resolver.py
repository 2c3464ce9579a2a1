"""What this worker runs, by name: its registered flows and the plain functions it allows.

A plain function enqueued rq-style is an implicit single-step flow named
``module:qualname``. It resolves only if its module is one that registers this worker's
flows (its ``--flows`` modules, or one that declared a ``@flow``) or matches an
``--allow-import`` prefix, whatever a producer or the database names; nothing else is
ever imported. ``@flow`` itself and the declared flows are the flow author's
(``worker.authoring.flows``).
"""

from __future__ import annotations

import importlib
import logging
import os
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

from runfleet.declaration.names import load_from_path
from runfleet.store.errors import UnknownFlow
from runfleet.worker.authoring.flows import Flow, declared_flow, declaring_modules, registered

log = logging.getLogger("runfleet.worker.flows")

_FLOW_MODULES: set[str] = set()
"""The worker's ``--flows`` modules (with ``declaring_modules``: whose plain functions run)."""
_PREFIXES: tuple[str, ...] | None = None
"""``--allow-import`` prefixes; None until a worker configures them (then the
``RUNFLEET_ALLOW_IMPORT`` environment variable decides)."""

_RESOLVED: set[str] = set()
"""Plain ``module:function`` names this process has resolved (``runnable``)."""
RESOLVED_KEPT = 10_000


def runnable() -> set[str]:
    """The flow names this process is known to run: its registered flows and the plain
    functions it has resolved so far. A claim's priority look-ahead takes a run in another
    run's place only among these (docs/how-to/queues.md), so it never activates one it
    cannot run. A versioned flow is left out: whether this process may run one of its runs
    depends on the run's version, which only the usual read-then-decide path checks
    (docs/explanation/lifecycle.md).
    A class-bound flow is left out for the same reason (its run's instance is read first)."""
    return {
        name for name, f in registered().items() if f.version is None and f.owner is None
    } | set(_RESOLVED)


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
    return sorted(_FLOW_MODULES | declaring_modules())


def import_allowed(module_name: str) -> bool:
    """Whether a plain function of ``module_name`` may run in this worker."""
    if module_name in _FLOW_MODULES or module_name in declaring_modules():
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
    found = declared_flow(name)
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
