"""A flow's children: ``child`` (attached, awaited) and ``spawn`` (detached).

``Children`` is one of ``context.Context``'s parts, built with the execution's
``replay.Replay`` and the worker's wake hint. A child is admitted
at most once per position: its id is recorded as the parent's step, so a replay finds
the same child instead of starting another, and the parent parks until the child's
outcome is delivered as a completion (following a handed-off child to its successor).

A child has its own flow's deadline (``@flow(timeout=)``, from its admission), as any
run of that flow has; an attached one is also cut to its parent's deadline at admission
(``store.admit``), so it never outlives the run that awaits it. A detached one keeps
its own.
"""

from __future__ import annotations

from typing import Any, TypeVar

import runfleet.worker.tracing as tracing
from runfleet.declaration import flow_target
from runfleet.store import validate
from runfleet.store.types import (
    AdmissionOptions,
    NewRun,
    OnParentExit,
    RunStatus,
    Waiting,
    WaitingReason,
)
from runfleet.worker.authoring.durable import ChildFailed
from runfleet.worker.authoring.flows import Flow, registered
from runfleet.worker.authoring.instances import child_instance
from runfleet.worker.authoring.replay import Replay
from runfleet.worker.authoring.versions import child_version
from runfleet.worker.wake_hints import HintFn

T = TypeVar("T")


class Children:
    """``Context``'s child runs (``ctx.child``, ``ctx.spawn`` call these)."""

    def __init__(self, replay: Replay, hint: HintFn | None) -> None:
        self._replay = replay
        self._hint = hint

    async def child(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> Any:
        """Start an attached child (ends with this run) and wait for its result."""
        child_id = await self._admit_child("child", flow, args, kwargs, run_id, OnParentExit.CANCEL)
        while True:
            done = await self._replay.deferred(f"child:{child_id}")
            if done is None:
                await self._replay.park(
                    Waiting(reason=WaitingReason.CHILD, token=child_id),
                    deferred=f"child:{child_id}",
                )
                continue
            outcome = done.value
            if outcome.get("handed_off_to"):
                child_id = outcome["handed_off_to"]
                continue
            if outcome["status"] != RunStatus.COMPLETED:
                raise ChildFailed(child_id, outcome["status"], outcome.get("error"))
            return outcome.get("result")

    async def spawn(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> str:
        """Start a detached child that outlives this run; returns its run id."""
        return await self._admit_child("spawn", flow, args, kwargs, run_id, OnParentExit.DETACH)

    async def _admit_child(
        self,
        kind: str,
        flow: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None,
        policy: OnParentExit,
    ) -> str:
        target = flow_target(flow)
        name, queue = target.name, target.queue
        call = await self._replay.next(kind, name)
        position, key, record = call.position, call.key, call.record
        if record is not None:
            return str(record.output["run_id"])
        target.check(list(args), kwargs)
        child_id = run_id or f"{self._replay.run.id}/{key}"
        with tracing.child_span(child_id, name, policy is not OnParentExit.CANCEL):
            return await self._admit_traced(
                position, key, kind, name, queue, child_id, args, kwargs, policy, flow
            )

    async def _admit_traced(
        self,
        position: int,
        key: str,
        kind: str,
        name: str,
        queue: str | None,
        child_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        policy: OnParentExit,
        flow: Any,
    ) -> str:
        new = NewRun(
            id=child_id,
            flow=name,
            queue=queue or self._replay.run.queue,
            payload={"args": list(args), "kwargs": kwargs},
            scopes=self._replay.run.scopes,
            parent_id=self._replay.run.id,
            on_parent_exit=policy,
            timeout_ms=_timeout_ms(flow, name),
            options=AdmissionOptions(
                flow_version=child_version(flow),
                flow_instance=child_instance(flow),
                trace=tracing.child_carrier(),
            ),
        )  # a retried create of the same id joins the run its first try admitted
        outcome = await self._replay.durable(
            "runs.create", lambda: self._replay.store.admission.create(new)
        )
        await self._replay.record(position, key, name, kind, {"run_id": child_id})
        if self._hint is not None:
            await self._hint(outcome.row)
        return child_id


def _timeout_ms(flow: Any, name: str) -> int | None:
    """The child flow's declared ``timeout`` in ms: from the ``@flow`` object, or the flow
    registered under the name given; a plain function or an unknown name has none."""
    declared = flow if isinstance(flow, Flow) else registered().get(name)
    if declared is None or declared.timeout is None:
        return None
    return validate.timeout_ms(declared.timeout)
