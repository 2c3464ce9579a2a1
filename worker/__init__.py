"""Executing runs: the driver, leases, sweeps, the flow API and the worker process."""

from worker.context import Context, Interrupted
from worker.durable import (
    ChildFailed,
    Decision,
    Handoff,
    NonDeterminism,
    Retry,
    WaitTimeout,
)
from worker.flows import Flow, flow
from worker.step_timeouts import StepTimeout
from worker.sync_context import SyncContext

__all__ = [
    "ChildFailed",
    "Context",
    "Decision",
    "Flow",
    "Handoff",
    "Interrupted",
    "NonDeterminism",
    "Retry",
    "StepTimeout",
    "SyncContext",
    "WaitTimeout",
    "flow",
]
