"""Executing runs: the driver, leases, sweeps, the flow API and the worker process."""

from worker.context import Context, Interrupted
from worker.flows import Flow, flow

__all__ = ["Context", "Flow", "Interrupted", "flow"]
