"""Executing runs: the driver, leases, sweeps, the flow API and the worker process."""

from runfleet.worker.context import Context, Interrupted
from runfleet.worker.durable import (
    ChildFailed,
    Decision,
    Handoff,
    NonDeterminism,
    Retry,
    WaitTimeout,
)
from runfleet.worker.flows import Flow, flow
from runfleet.worker.instances import FlowInstance
from runfleet.worker.step_timeouts import StepTimeout
from runfleet.worker.sync_context import SyncContext

__all__ = [
    "ChildFailed",
    "Context",
    "Decision",
    "Flow",
    "FlowInstance",
    "Handoff",
    "Interrupted",
    "NonDeterminism",
    "Retry",
    "StepTimeout",
    "SyncContext",
    "WaitTimeout",
    "flow",
]
