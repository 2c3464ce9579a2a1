"""A job's function found among the modules this process loaded, and called here.

rq's ``job.perform()``, ``Queue(is_async=False)`` and the callbacks it runs call a
function in the producer's own process: never one imported because a row names it
(``producer.trust.already_loaded``). ``get_current_job()`` answers the job meanwhile.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from typing import Any

from runfleet.declaration import FlowDeclaration
from runfleet.declaration.names import load_from_path
from runfleet.producer.trust import already_loaded
from runfleet.rqface.current import current_job
from runfleet.store.errors import UnknownFlow


def resolve_loaded(name: str) -> Any:
    """A callback's function from its stored name, among modules already loaded; None
    when it is not loaded here."""
    module, _, attr = name.partition(":")
    if module == "builtins":
        return getattr(builtins, attr, None)
    return load_from_path(name, already_loaded)


def loaded_function(name: str) -> Any:
    """The function ``name`` stands for (a ``@flow``'s own function); UnknownFlow when no
    module this process loaded has it."""
    if name.startswith("builtins:"):
        return getattr(builtins, name.partition(":")[2])
    fn = load_from_path(name, already_loaded)
    if fn is None:
        raise UnknownFlow(name, "not a function of a module this process has loaded")
    return fn.fn if isinstance(fn, FlowDeclaration) else fn


def call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` on its arguments; a coroutine function runs to its end on a loop of its own."""
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    return fn(*args, **kwargs)


def perform(job: object, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The function ``name`` on the arguments, here; ``get_current_job()`` answers ``job``."""
    fn = loaded_function(name)
    token = current_job.set(job)
    try:
        return call(fn, args, kwargs)
    finally:
        current_job.reset(token)
