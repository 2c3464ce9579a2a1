"""runfleet: durable runs for Python worker fleets. Postgres decides, Redis hints.

The public API is this module's ``__all__``::

    from runfleet import Queue, Retry, flow

Producers enqueue with ``Queue`` (rq-shaped, synchronous) or ``AsyncQueue``; flows are
functions decorated with ``@flow`` whose steps a worker records (``Context``). Everything
else lives in the subpackages, which are internals: ``runfleet.store`` (Postgres, the
truth), ``runfleet.broker`` (Redis hints and liveness), ``runfleet.producer`` (the native
producer API), ``runfleet.rqface`` (rq's face over it), ``runfleet.declaration`` (a flow's
declaration), ``runfleet.worker`` (executing runs) and ``runfleet.ops`` (the CLI,
dashboard, demo and benchmarks).

Names load on first use, so a producer's ``from runfleet import Queue`` never imports the
worker, and importing any ``runfleet.*`` module does not import them all.

Two ``Retry`` classes exist because two different things are retried: ``Retry(max=,
interval=)`` is rq's policy for an enqueued job (the producer's side), ``StepRetry(attempts=,
backoff=)`` is a flow step's (``ctx.step(..., retry=StepRetry(attempts=5))``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from runfleet.producer import (
        AsyncQueue,
        AsyncRun,
        Callback,
        EnqueueSpec,
        EventAnswer,
        EventCompleted,
        EventExisting,
        EventRunSettled,
        EventTimedOut,
        Retry,
        RunCancelled,
        RunDead,
        RunFailed,
        RunNotFound,
    )
    from runfleet.rqface import (
        CanceledJobRegistry,
        DeferredJobRegistry,
        Dependency,
        DuplicateJobError,
        FailedJobRegistry,
        FinishedJobRegistry,
        InvalidJobOperation,
        Job,
        JobStatus,
        JobTimeoutException,
        NoSuchJobError,
        Queue,
        Result,
        Run,
        ScheduledJobRegistry,
        StartedJobRegistry,
        cancel_job,
        get_current_job,
        job,
        requeue_job,
        send_stop_job_command,
    )
    from runfleet.store.config import Settings
    from runfleet.store.errors import (
        DuplicateRun,
        InvalidInput,
        NotImportable,
        RunfleetError,
        Unavailable,
    )
    from runfleet.worker import (
        ChildFailed,
        Context,
        Decision,
        Flow,
        FlowInstance,
        Handoff,
        Interrupted,
        NonDeterminism,
        StepTimeout,
        SyncContext,
        WaitTimeout,
        flow,
    )
    from runfleet.worker import Retry as StepRetry

# Public name -> (module, attribute there).
_WHERE: dict[str, tuple[str, str]] = {
    **{
        name: ("runfleet.producer", name)
        for name in (
            "AsyncQueue",
            "AsyncRun",
            "EnqueueSpec",
            "EventAnswer",
            "EventCompleted",
            "EventExisting",
            "EventRunSettled",
            "EventTimedOut",
            "RunCancelled",
            "RunDead",
            "RunFailed",
            "RunNotFound",
        )
    },
    **{
        name: ("runfleet.rqface", name)
        for name in (
            "Callback",
            "CanceledJobRegistry",
            "DeferredJobRegistry",
            "Dependency",
            "DuplicateJobError",
            "FailedJobRegistry",
            "FinishedJobRegistry",
            "InvalidJobOperation",
            "Job",
            "JobStatus",
            "JobTimeoutException",
            "NoSuchJobError",
            "Queue",
            "Result",
            "Retry",
            "Run",
            "ScheduledJobRegistry",
            "StartedJobRegistry",
            "cancel_job",
            "get_current_job",
            "job",
            "requeue_job",
            "send_stop_job_command",
        )
    },
    **{
        name: ("runfleet.worker", name)
        for name in (
            "ChildFailed",
            "Context",
            "Decision",
            "Flow",
            "FlowInstance",
            "Handoff",
            "Interrupted",
            "NonDeterminism",
            "StepTimeout",
            "SyncContext",
            "WaitTimeout",
            "flow",
        )
    },
    "StepRetry": ("runfleet.worker", "Retry"),
    "Settings": ("runfleet.store.config", "Settings"),
    "DuplicateRun": ("runfleet.store.errors", "DuplicateRun"),
    "InvalidInput": ("runfleet.store.errors", "InvalidInput"),
    "NotImportable": ("runfleet.store.errors", "NotImportable"),
    "RunfleetError": ("runfleet.store.errors", "RunfleetError"),
    "Unavailable": ("runfleet.store.errors", "Unavailable"),
}

__all__ = [
    "AsyncQueue",
    "AsyncRun",
    "Callback",
    "CanceledJobRegistry",
    "ChildFailed",
    "Context",
    "Decision",
    "DeferredJobRegistry",
    "Dependency",
    "DuplicateJobError",
    "DuplicateRun",
    "EnqueueSpec",
    "EventAnswer",
    "EventCompleted",
    "EventExisting",
    "EventRunSettled",
    "EventTimedOut",
    "FailedJobRegistry",
    "FinishedJobRegistry",
    "Flow",
    "FlowInstance",
    "Handoff",
    "Interrupted",
    "InvalidInput",
    "InvalidJobOperation",
    "Job",
    "JobStatus",
    "JobTimeoutException",
    "NoSuchJobError",
    "NonDeterminism",
    "NotImportable",
    "Queue",
    "Result",
    "Retry",
    "Run",
    "RunCancelled",
    "RunDead",
    "RunFailed",
    "RunNotFound",
    "RunfleetError",
    "ScheduledJobRegistry",
    "Settings",
    "StartedJobRegistry",
    "StepRetry",
    "StepTimeout",
    "SyncContext",
    "Unavailable",
    "WaitTimeout",
    "__version__",
    "cancel_job",
    "flow",
    "get_current_job",
    "job",
    "requeue_job",
    "send_stop_job_command",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module the first time it is asked for (PEP 562)."""
    try:
        module, attribute = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'runfleet' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
