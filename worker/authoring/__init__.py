"""What a flow author reads: ``@flow``, ``Context`` and its parts, and the words of durable flows.

``flows`` (``@flow``, ``Flow``), ``context`` (``Context``: steps, and the parts built with
the activation's ``replay``: ``waits``, ``children``, ``messages``, ``versions``),
``sync_context`` (the same calls for a plain ``def`` flow), ``step_timeouts``,
``instances`` (class-bound flows) and ``durable`` (``Retry``, ``Handoff``, ``Decision``,
the errors and control exceptions). The fleet machinery (the driver, leases, sweeps, the
worker process) imports from here; nothing here imports it. Beneath the room lies only the
worker's plumbing it calls (``tracing``, ``metrics``, ``threads``, ``containment``,
``retry``, ``bookkeeping``, ``wake_hints``, ``unrunnable``), which imports neither
(tests/worker/test_layers.py).
"""

from runfleet.worker.authoring.context import Context
from runfleet.worker.authoring.durable import (
    ChildFailed,
    Decision,
    Handoff,
    Interrupted,
    NonDeterminism,
    Retry,
    WaitTimeout,
)
from runfleet.worker.authoring.flows import Flow, flow
from runfleet.worker.authoring.instances import FlowInstance
from runfleet.worker.authoring.step_timeouts import StepTimeout
from runfleet.worker.authoring.sync_context import SyncContext

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
