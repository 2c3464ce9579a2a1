"""A flow's declaration, beneath producer and worker: both read it, neither imports the other.

``FlowDeclaration`` (``declaration.flow``) carries what a flow declares (name, queue,
timeout, version, priority, rounds, instance) and checks arguments against its signature;
``flow_target`` (``declaration.targets``) declares whatever an enqueue names; names across
processes (``module:qualname``) are ``declaration.names``. Imports only ``store`` and
``runtime``.
"""

from runfleet.declaration.flow import (
    INSTANCE_STATE_KEY,
    FlowDeclaration,
    admission_instance,
    check_signature,
    instance_allows,
)
from runfleet.declaration.targets import flow_target

__all__ = [
    "INSTANCE_STATE_KEY",
    "FlowDeclaration",
    "admission_instance",
    "check_signature",
    "flow_target",
    "instance_allows",
]
