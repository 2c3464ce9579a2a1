"""What a flow declares, read alike by the producer that admits its runs and the worker.

A ``@flow`` (``worker.authoring.flows.Flow``) is a ``FlowDeclaration`` with a registry's extras; a
plain function or a ``module:function`` name is declared on the spot (``declaration.targets``).
The producer reads these fields to admit a run (its queue, timeout, version, priority,
rounds, instance) and checks the arguments against the signature before any write; the
worker checks a child's and a handoff's the same way. Neither imports the other for it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runfleet.store.errors import InstanceNotAllowed, InvalidInput
from runfleet.store.roles import WILDCARD

INSTANCE_STATE_KEY = "flow_instance"
"""Where a run's state keeps the instance a class-bound flow was admitted for
(``worker.authoring.instances``)."""


@dataclass(frozen=True)
class FlowDeclaration:
    """A flow as admission and execution both read it."""

    name: str
    """The flow's name, as a worker resolves it."""
    fn: Callable[..., Any] | None
    """The function to check the arguments against; None for a name (late binding)."""
    queue: str | None = None
    """The queue a ``@flow`` declared; None: the one enqueued on decides."""
    takes_context: bool = True
    """Whether its body takes ``ctx`` first (a ``@flow``), not a plain function."""
    max_rounds: int | None = None
    """The handoff rounds its lineage may take (``ctx.handoff``); None: no limit."""
    timeout: float | None = None
    """Its runs' deadline in seconds from admission; None: none declared."""
    priority: int | None = None
    """Its runs' priority when the enqueue names none (docs/how-to/queues.md); None: the queue's."""
    version: str | None = None
    """The version of this code (``worker.authoring.versions``); None: unversioned, takes
    any run."""
    owner: type | None = None
    """The ``FlowInstance`` class whose method this is (``worker.authoring.instances``);
    None: none."""
    instance: str | None = None
    """The instance this flow is bound to (``instance.method``); None: unbound."""
    instance_scopes: tuple[str, ...] | None = None
    """The run scopes that instance was declared for (``FlowInstance(scopes=...)``)."""

    @property
    def needs_instance(self) -> bool:
        """A class-level flow of a ``FlowInstance`` class: no instance to run it on."""
        return self.owner is not None and self.instance is None

    def check(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """InvalidInput unless ``args``/``kwargs`` bind to the function (before any write)."""
        check_signature(self.fn, self.takes_context, args, kwargs)

    def admitted_instance(self, scopes: Sequence[str] | None = None) -> str | None:
        """The instance a run of this flow is admitted for (``AdmissionOptions.
        flow_instance``): its name for a bound class-level flow (``instance.method``), None
        for a flow of no instance; a class-level one names no instance: refused.

        ``scopes``: the run's; an instance declared for other scopes refuses it here
        (``InstanceNotAllowed``), as every worker does again before it runs it
        (``worker.authoring.instances.for_run``: the worker's own instance decides, not the
        producer's).
        """
        if self.needs_instance:
            raise InvalidInput(
                "flow",
                f"{self.name!r} is a method of a FlowInstance class: "
                "enqueue it from an instance (instance.method)",
            )
        if self.instance is None:
            return None
        allowed = self.instance_scopes
        if scopes is not None and allowed is not None and not instance_allows(allowed, scopes):
            raise InstanceNotAllowed(self.instance, allowed, scopes)
        return self.instance


def admission_instance(target: object, scopes: Sequence[str] | None = None) -> str | None:
    """``target``'s ``admitted_instance`` when it is a declaration; None for a plain
    function or a name."""
    return target.admitted_instance(scopes) if isinstance(target, FlowDeclaration) else None


def instance_allows(allowed: Sequence[str], scopes: object) -> bool:
    """Whether an instance declared for ``allowed`` may run a run of ``scopes``: every
    scope of the run is allowed (``*`` allows any run, unscoped ones too), and a run of
    no scopes only by ``*``. A run's scopes name who reads and controls it: a run readable
    by another tenant never uses this tenant's instance."""
    if WILDCARD in allowed:
        return True
    if not isinstance(scopes, list | tuple) or not scopes:
        return False
    return all(isinstance(s, str) and s in allowed for s in scopes)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, computed once per function (``inspect.signature`` costs more
    than the rest of an admission's Python); None when it has none to check against."""
    try:
        return _signatures(fn)
    except TypeError:  # unhashable: not cached
        try:
            return inspect.signature(fn)
        except (TypeError, ValueError):
            return None
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _signatures(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def check_signature(
    fn: Callable[..., Any] | None, takes_ctx: bool, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """InvalidInput unless ``args``/``kwargs`` (after ``ctx`` when ``takes_ctx``) bind to
    ``fn``; nothing to check when ``fn`` is None (a name, late bound)."""
    if fn is None:
        return
    signature = _signature(fn)
    if signature is None:
        return
    try:
        signature.bind(*([None] if takes_ctx else []), *args, **kwargs)
    except TypeError as exc:
        raise InvalidInput(
            "payload", f"does not match {fn.__qualname__}{signature}: {exc}"
        ) from None
