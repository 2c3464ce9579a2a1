"""What an enqueue target declares: a ``@flow``, a plain function or a ``module:function`` name."""

from __future__ import annotations

import reprlib
from typing import Any

from runfleet.declaration.flow import FlowDeclaration
from runfleet.declaration.names import importable_name, main_module_name, qualified_name
from runfleet.store import validate
from runfleet.store.errors import InvalidInput, NotImportable


def flow_target(target: Any, *, elsewhere: bool = True) -> FlowDeclaration:
    """The declaration of what ``target`` names.

    Accepts a ``@flow`` object (itself a ``FlowDeclaration``), a plain function (rq-style
    implicit single-step flow) or a ``"module:function"`` name (late binding). A plain
    function a worker could not import by its name is refused with ``NotImportable`` (a
    lambda, a nested function, one of the producer's ``__main__``), unless ``elsewhere``
    is False: it runs in this very process (rq's ``is_async=False``). A function of a
    ``__main__`` run as ``python -m pkg.mod`` is named by that module. A class-level flow
    of a ``FlowInstance`` class is refused (``FlowDeclaration.admitted_instance``).
    """
    if isinstance(target, FlowDeclaration):
        target.admitted_instance()
        return target
    if isinstance(target, str):
        return FlowDeclaration(validate.identifier("flow", target), None, takes_context=False)
    if callable(target) and hasattr(target, "__module__") and hasattr(target, "__qualname__"):
        name = importable_name(target)
        if name is None:
            lambda_ = getattr(target, "__name__", None) == "<lambda>"
            why = "is a lambda" if lambda_ else "is defined inside another function"
            raise NotImportable(qualified_name(target), why)
        if elsewhere and target.__module__ == "__main__":
            main = main_module_name()
            if main is None:
                raise NotImportable(name, "is defined in __main__, the script being run")
            name = f"{main}:{target.__qualname__}"
        return FlowDeclaration(name, target, takes_context=False)
    raise InvalidInput(
        "flow", f"cannot enqueue {reprlib.repr(target)}: pass a flow, a function or 'mod:fn'"
    )
