"""Class-bound flows: flows and steps that are methods of a configured instance.

DBOS's ``@DBOS.dbos_class`` with ``instance_name``: one flow definition serves several
configured tenants or connections. A class derives from ``FlowInstance``; its ``@flow``
methods are flows like any other (one name each, registered once), and each instance is
named when it is made::

    class Billing(FlowInstance):
        def __init__(self, tenant: str, dsn: str) -> None:
            super().__init__(instance_name=tenant, scopes=[tenant])
            self.dsn = dsn

        @flow(name="billing.charge")
        async def charge(self, ctx: Context, amount: int) -> str:
            return await ctx.step("charge", self.post_charge, amount)

    acme = Billing("acme", "postgres://acme/...")
    q.enqueue(acme.charge, 10)  # admitted for instance 'acme'

- ``acme.charge`` is the flow bound to that instance: a producer enqueuing it (or a flow
  starting it as a child) admits the run with the instance's name (``state.flow_instance``).
  The class-level ``Billing.charge`` names no instance and is refused (``InvalidInput``).
- A worker resolves the instance by that name among the instances its ``--flows`` modules
  made (at import, as DBOS requires them made before launch), on every activation: the
  first, a resume after a wait, and a takeover after a SIGKILL. A worker without that
  instance never claims, steals or wakes the run (``run.instance_unknown``, once per run);
  a worker that has it does.
- An instance serves only the run scopes it was declared with: a run whose scopes are not
  all among them is refused at admission (``InstanceNotAllowed``) and, whatever wrote its
  row, never run on the instance by a worker (``run.instance_refused``, once per run).
- Steps are the instance's methods passed to ``ctx.step`` (``self.post_charge``): they see
  the instance's configuration in whichever process runs the step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runfleet.declaration import INSTANCE_STATE_KEY, admission_instance, instance_allows
from runfleet.store import validate
from runfleet.store.errors import InvalidInput

__all__ = ["INSTANCE_STATE_KEY", "FlowInstance", "for_run", "instance"]

if TYPE_CHECKING:
    from runfleet.worker.authoring.flows import Flow
    from runfleet.worker.unrunnable import Unrunnable

log = logging.getLogger("runfleet.worker.flows")

_INSTANCES: dict[tuple[type, str], FlowInstance] = {}
"""(class, instance name) -> the instance; every FlowInstance class in its MRO is a key."""


class FlowInstance:
    """A configured instance whose ``@flow`` methods are class-bound flows.

    Derive from it and call ``super().__init__(instance_name=...)``; make the instances at
    import of the worker's ``--flows`` modules. ``instance.method`` is the flow bound to
    that instance (enqueue it, or start it as a child); a worker runs the run on the
    instance of that name it made, on every activation, a takeover included; one that
    did not make it leaves the run alone (docs/explanation/lifecycle.md "Class-bound flows").
    """

    def __init__(self, instance_name: str, *, scopes: Sequence[str]) -> None:
        """``scopes``: the run scopes allowed to use this instance (``["*"]``: any run).
        A run of other scopes is refused at admission (``InstanceNotAllowed``) and never
        run on it by a worker, whatever its row says."""
        self.instance_name = validate.identifier("instance_name", instance_name)
        if isinstance(scopes, str) or not scopes:
            raise InvalidInput("scopes", "name the run scopes allowed to use this instance")
        self.scopes: tuple[str, ...] = tuple(validate.identifier("scopes", s) for s in scopes)
        for cls in type(self).__mro__:
            if cls is FlowInstance or not issubclass(cls, FlowInstance):
                continue
            existing = _INSTANCES.get((cls, self.instance_name))
            if existing is not None and existing is not self:
                log.warning(
                    "flow.instance_reregistered",
                    extra={"class": cls.__qualname__, "instance": self.instance_name},
                )
            _INSTANCES[(cls, self.instance_name)] = self


def instance(owner: type, name: str) -> FlowInstance | None:
    """The instance of ``owner`` (or of a subclass) called ``name`` in this process."""
    return _INSTANCES.get((owner, name))


def instances(owner: type) -> list[str]:
    """The names of ``owner``'s instances in this process, sorted."""
    return sorted(name for cls, name in _INSTANCES if cls is owner)


def binds(owner: type) -> bool:
    """Whether a ``@flow`` assigned in ``owner``'s body is a class-bound flow."""
    return isinstance(owner, type) and issubclass(owner, FlowInstance)


def admitted_instance(row: Any) -> str | None:
    value = row.state.get(INSTANCE_STATE_KEY)
    return value if isinstance(value, str) else None


def for_run(flow: Flow, row: Any, warned: Unrunnable) -> Flow | None:
    """``flow`` as it runs ``row``: itself for a flow of no class, else bound to the
    instance the run was admitted for; None (logged ``run.instance_unknown`` once per
    run) when this process has no such instance, or the run names none; None too (logged
    ``run.instance_refused``) when the run's scopes may not use that instance (a raw row
    of one tenant naming another's instance)."""
    if flow.owner is None:
        return flow
    name = admitted_instance(row)
    found = instance(flow.owner, name) if name is not None else None
    if found is not None and instance_allows(found.scopes, row.state.get("scopes")):
        return flow.bound_to(found)
    if found is not None:  # a row naming an instance its scopes may not use
        why = f"its scopes may not use instance {name}"
        if warned.first(row.id, why):
            log.warning(
                "run.instance_refused",
                extra={
                    "run_id": row.id,
                    "flow": row.flow,
                    "instance": name,
                    "scopes": row.state.get("scopes"),
                    "allowed": list(found.scopes),
                },
            )
        return None
    why = f"admitted for instance {name}, which this worker did not make"
    if warned.first(row.id, why if name is not None else "admitted for no instance"):
        log.warning(
            "run.instance_unknown",
            extra={
                "run_id": row.id,
                "flow": row.flow,
                "instance": name,
                "instances": instances(flow.owner),
            },
        )
    return None


def child_instance(flow: Any) -> str | None:
    """A child's ``flow_instance``: the instance of the bound ``@flow`` it was started with."""
    return admission_instance(flow)
