"""What a producer may choose: run ids outside the derived namespace, scopes as a list.

Derived ids are runfleet's: a child is ``<parent>/child:<flow>#<n>`` (``/spawn:`` when
detached) and a later round of a lineage is ``<lineage>@<n>``. A producer that could
admit one of those ids first would squat on it and make the parent or the handoff fail
(``ExecutionIdentityConflict``), so producers are refused them here, before any write.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from types import ModuleType

from runfleet.store import validate
from runfleet.store.errors import InvalidInput, ReservedRunId

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


def already_loaded(module_name: str) -> ModuleType | None:
    """A producer's ``load`` (``declaration.names.load_from_path``): a module this process
    imported itself, never the stdlib.

    Producers never import a module named by a string (importing runs its code)."""
    if module_name.partition(".")[0] in sys.stdlib_module_names:
        return None
    return sys.modules.get(module_name)
