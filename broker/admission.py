"""What a producer may admit: resolving flow targets and checking arguments before any write."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.errors import InvalidInput, UnknownFlow


def flow_target(target: Any) -> tuple[str, str | None, Callable[..., Any] | None, bool]:
    """(flow name, its declared queue, the function to check arguments against, takes ctx).

    Accepts a ``@flow`` object (recognised by its ``runfleet_flow`` attribute, so
    the broker never imports the worker), a plain function (rq-style implicit
    single-step flow) or a ``"module:function"`` name (late binding).
    """
    declared = getattr(target, "runfleet_flow", None)
    if declared is not None:
        name, queue = declared
        return name, queue, getattr(target, "fn", None), True
    if isinstance(target, str):
        if not target:
            raise InvalidInput("flow", "must not be empty")
        return target, None, None, False
    if callable(target) and hasattr(target, "__module__") and hasattr(target, "__qualname__"):
        if "<locals>" in target.__qualname__ or target.__qualname__ == "<lambda>":
            raise InvalidInput("flow", f"{target.__qualname__} is not importable by a worker")
        return f"{target.__module__}:{target.__qualname__}", None, target, False
    raise InvalidInput("flow", f"cannot enqueue {target!r}: pass a flow, a function or 'mod:fn'")


def check_signature(
    fn: Callable[..., Any] | None, takes_ctx: bool, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    if fn is None:
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*([None] if takes_ctx else []), *args, **kwargs)
    except TypeError as exc:
        raise InvalidInput(
            "payload", f"does not match {fn.__qualname__}{signature}: {exc}"
        ) from None


@dataclass(frozen=True)
class EnqueueSpec:
    """One run of an ``enqueue_many`` batch (rq's ``Queue.prepare_data``)."""

    target: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None


def importable(name: str) -> bool:
    """Whether ``module:function`` names something callable in this process."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        return False
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError):
        return False
    return callable(target)


def unknown(name: str) -> UnknownFlow:
    return UnknownFlow(
        name,
        "no worker has registered it and it is not an importable module:function "
        "(pass late_binding=True to admit it anyway)",
    )
