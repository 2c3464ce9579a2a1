"""Executing runs: the driver, leases, sweeps and the worker process, over the flow
author's API (``runfleet.worker.authoring``), whose names are re-exported here."""

from runfleet.worker.authoring import (
    ChildFailed,
    Context,
    Decision,
    Flow,
    FlowInstance,
    Handoff,
    Interrupted,
    NonDeterminism,
    Retry,
    StepTimeout,
    SyncContext,
    WaitTimeout,
    flow,
)

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
