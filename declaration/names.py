"""Code named by a string: ``module:qualname``, written and resolved in one place.

A producer names a function so that a worker, another process, can find it; a saga
stores its compensation by name and a later process resolves it. The grammar (a module
path, one colon, a dotted attribute path) and the rule for what a name may resolve to
live here once, as procrastinate's ``utils.load_from_path``. What a process may import
while resolving is its caller's policy, passed as ``load``: producers import nothing
(their trust module's ``already_loaded``), workers only their ``--flows`` and
``--allow-import`` modules (``worker.resolver``).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from runfleet.declaration.flow import FlowDeclaration


def qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname``: how a function is named across processes."""
    return f"{fn.__module__}:{fn.__qualname__}"


def importable_name(target: object) -> str | None:
    """``qualified_name`` of a module-level function; None when no other process could
    import it by that name (a lambda, a function defined inside another, no name)."""
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not qualname:
        return None
    if "<locals>" in qualname or qualname == "<lambda>":
        return None
    return f"{module}:{qualname}"


def main_module_name() -> str | None:
    """The name ``__main__`` can be imported by in another process: its module's when it
    was run as ``python -m pkg.mod`` (``__spec__``), None for a script, a REPL or a
    notebook (nothing else could import those)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    return name if isinstance(name, str) and name and name != "__main__" else None


def load_from_path(name: str, load: Callable[[str], ModuleType | None]) -> Any | None:
    """The plain function (or ``@flow`` object) ``module:qualname`` names, else None.

    ``load`` decides whether the module may be had at all (producers: only one already
    loaded; workers: only their ``--flows`` modules and ``--allow-import`` prefixes).
    The walk never passes through another module or a dunder, and the target must be a
    Python function defined in that very module: not a builtin (``os:system``), a class,
    or a function re-exported from elsewhere (``app.tasks:getenv``).
    """
    module_name, _, attr = name.partition(":")
    parts = attr.split(".")
    if (
        not module_name
        or not attr
        or any(not p.isidentifier() or p.startswith("__") for p in parts)
    ):
        return None
    module = load(module_name)
    if module is None:
        return None
    target: Any = module
    for part in parts:
        target = getattr(target, part, None)
        if target is None or isinstance(target, ModuleType):
            return None
    if isinstance(target, FlowDeclaration):
        return target
    if not inspect.isfunction(target) or target.__module__ != module_name:
        return None
    return target
