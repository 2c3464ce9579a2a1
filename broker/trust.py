"""What a producer may choose: run ids outside the derived namespace, scopes as a list.

Derived ids are runfleet's: a child is ``<parent>/child:<flow>#<n>`` (``/spawn:`` when
detached) and a later round of a lineage is ``<lineage>@<n>``. A producer that could
admit one of those ids first would squat on it and make the parent or the handoff fail
(``ExecutionIdentityConflict``), so producers are refused them here, before any write.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from store import validate
from store.errors import InvalidInput, ReservedRunId

_ROUND = re.compile(r"@\d+\Z")
_DERIVED = ("/child:", "/spawn:")


def producer_run_id(run_id: object) -> str:
    """``run_id`` if a producer may choose it; InvalidInput / ReservedRunId otherwise."""
    checked = validate.identifier("run_id", run_id)
    for marker in _DERIVED:
        if marker in checked:
            raise ReservedRunId(checked, f"{marker!r} names a run's children")
    if _ROUND.search(checked):
        raise ReservedRunId(checked, "an '@<number>' suffix names a round of a lineage")
    return checked


def producer_scopes(scopes: object) -> tuple[str, ...]:
    """A producer's scopes as a tuple of names; a bare string is refused, not split."""
    if isinstance(scopes, str | bytes):
        raise InvalidInput("scopes", "must be a list of scope names, not one string")
    if not isinstance(scopes, Iterable):
        raise InvalidInput("scopes", f"must be a list of scope names, got {type(scopes).__name__}")
    return tuple(validate.identifier("scopes", scope) for scope in scopes)


def lookup(name: str, load: Callable[[str], ModuleType | None]) -> Any | None:
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
    if getattr(target, "runfleet_flow", None) is not None:
        return target
    if not inspect.isfunction(target) or target.__module__ != module_name:
        return None
    return target


def already_loaded(module_name: str) -> ModuleType | None:
    """A producer's ``load``: a module this process imported itself, never the stdlib.

    Producers never import a module named by a string (importing runs its code)."""
    if module_name.partition(".")[0] in sys.stdlib_module_names:
        return None
    return sys.modules.get(module_name)
