"""What a flow body sees: its run, and the durable calls that make it resumable.

Every resume re-executes the body from the top. Each durable call takes the next
position; a call already recorded at that position returns its recorded value without
running, a different call there is NonDeterminism, and a record whose digest no longer
matches parks the run in ``quarantine``. A call that must wait parks the run
(``Suspended``) and the body resumes by replay when answered.

``Context`` is the flow's face only: the replay bookkeeping (positions, records, durable
retry, parks, clocks, the interrupt) is ``worker.replay.Replay``, which the driver builds
for each activation; ``step`` is here, and the timers and waits (``worker.waits``), child
runs (``worker.children``), events and messages (``worker.messages``) and patches
(``worker.versions``) are parts built with that same replay, each call handed on to them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import Owner, RunRow, Waiting, WaitingReason
from runfleet.store.values import Undecodable
from runfleet.worker import tracing
from runfleet.worker.children import Children
from runfleet.worker.containment import closed_from_outside, safe_str
from runfleet.worker.durable import NO_RETRY, Decision, Retry, reference
from runfleet.worker.flows import function as resolve_function
from runfleet.worker.messages import Messages
from runfleet.worker.outcomes import Cause
from runfleet.worker.replay import Interrupted, Replay
from runfleet.worker.step_timeouts import call_with_timeout, checked_timeout
from runfleet.worker.threads import in_thread
from runfleet.worker.versions import Versions
from runfleet.worker.waits import Waits
from runfleet.worker.wake_hints import HintFn

__all__ = ["Context", "Interrupted"]

log = logging.getLogger("runfleet.flow")


class Context:
    """The durable calls of one activation of a run, built with its ``Replay``."""

    def __init__(self, replay: Replay, *, hint: HintFn | None = None) -> None:
        self.replay = replay
        self.hint = hint
        self._waits = Waits(replay)
        self._children = Children(replay, hint)
        self._messages = Messages(replay, hint)
        self._versions = Versions(replay)
        self.log = logging.LoggerAdapter(log, {"run_id": replay.run.id, "flow": replay.run.flow})

    # ---- the run -------------------------------------------------------------

    @property
    def run(self) -> RunRow:
        return self.replay.run

    @property
    def run_id(self) -> str:
        return self.replay.run.id

    @property
    def owner(self) -> Owner:
        return self.replay.owner

    @property
    def epoch(self) -> int:
        return self.replay.epoch

    @property
    def store(self) -> Store | None:
        """The worker's store (None in a Context built without one: no durable calls)."""
        return self.replay._store

    @property
    def settings(self) -> Settings | None:
        return self.replay.settings

    @property
    def args(self) -> list[Any]:
        return list(self._payload().get("args") or [])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self._payload().get("kwargs") or {})

    def _payload(self) -> dict[str, Any]:
        """The run's arguments; a payload this process cannot decode fails the run, named."""
        payload = self.run.payload
        if isinstance(payload, Undecodable):
            raise InvalidInput("payload", f"run {self.run.id!r}: {payload}")
        return dict(payload or {})

    # ---- what the driver and the watchdog read ---------------------------------

    @property
    def interrupted(self) -> Cause | None:
        return self.replay.interrupted

    @property
    def in_bookkeeping(self) -> int:
        """Depth of runfleet's own store calls in progress (``Replay.in_bookkeeping``)."""
        return self.replay.in_bookkeeping

    @property
    def bookkeeping_error(self) -> BaseException | None:
        return self.replay.bookkeeping_error

    @property
    def wake_hint(self) -> float | None:
        """Monotonic time a timer park is due: the driver asks for a wake then."""
        return self.replay.wake_hint

    def check(self) -> None:
        """Raise Interrupted if this drive must stop (sync bodies reach it at durable calls)."""
        self.replay.check()

    def raised_by_runfleet(self, exc: BaseException) -> bool:
        return self.replay.raised_by_runfleet(exc)

    def raised_by_user(self, exc: BaseException) -> bool:
        """A BaseException that is not an ``Exception``, not runfleet's own stop, and not the
        ``GeneratorExit`` of the run's coroutine being closed from outside its task."""
        return (
            not isinstance(exc, Exception)
            and not self.raised_by_runfleet(exc)
            and not closed_from_outside(exc, self.run_id)
        )

    # ---- timers and waits (worker.waits) ---------------------------------------

    async def sleep(self, duration: timedelta | float) -> None:
        await self._waits.sleep(duration)

    async def sleep_until(self, when: datetime) -> None:
        await self._waits.sleep_until(when)

    async def wait_for(self, name: str, timeout: float | None = None) -> Any:
        """Wait for an event completed through ``Queue.complete(run_id, name, value)``."""
        return await self._waits.wait_for(name, timeout)

    async def approval(
        self,
        name: str,
        request: Any = None,
        timeout: float | None = None,
        *,
        on_token: Callable[[str], Any] | None = None,
    ) -> Decision:
        """Park until a person approves or denies (``Queue.approve/deny`` with the token)."""
        return await self._waits.approval(name, request, timeout, on_token=on_token)

    async def quota(self, wake_at: datetime | int) -> None:
        """Park until ``wake_at`` (a provider's quota window); a datetime or epoch ms."""
        await self._waits.quota(wake_at)

    # ---- children (worker.children) --------------------------------------------

    async def child(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> Any:
        """Start an attached child (ends with this run) and wait for its result."""
        return await self._children.child(flow, *args, run_id=run_id, **kwargs)

    async def spawn(self, flow: Any, *args: Any, run_id: str | None = None, **kwargs: Any) -> str:
        """Start a detached child that outlives this run; returns its run id."""
        return await self._children.spawn(flow, *args, run_id=run_id, **kwargs)

    # ---- events and messages (worker.messages) ---------------------------------

    async def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as this run's event ``key`` (``Queue.get_event`` reads it)."""
        await self._messages.set_event(key, value)

    async def recv(self, topic: str, timeout: float | None = None) -> Any:
        """The next message sent to this run on ``topic`` (``Queue.send``), in send order."""
        return await self._messages.recv(topic, timeout)

    async def send(self, run_id: str, topic: str, value: Any = None) -> bool:
        """Send ``value`` to run ``run_id``'s ``recv(topic)``, once; False if it had settled."""
        return await self._messages.send(run_id, topic, value)

    async def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        """Run ``run_id``'s event ``key`` (None if unset), waiting up to ``timeout`` s."""
        return await self._messages.get_event(run_id, key, timeout)

    # ---- versions (worker.versions) --------------------------------------------

    async def patched(self, patch_id: str) -> bool:
        """Whether this execution takes the code path added by patch ``patch_id``."""
        return await self._versions.patched(patch_id)

    # ---- steps -------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: Retry | None = None,
        compensate: Callable[..., Any] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn`` once for this run and record its output; replays return the record.

        ``timeout`` (seconds) bounds each attempt: ``StepTimeout`` past it, retried under
        ``retry`` like any failure (``worker.step_timeouts``)."""
        limit = checked_timeout(timeout) if timeout is not None else None
        call = await self.replay.next("step", name)
        position, key, record = call.position, call.key, call.record
        if record is not None:
            return record.output
        policy = retry or NO_RETRY
        undo = reference(compensate) if compensate is not None else None
        if undo is not None:
            resolve_function(undo)  # UnknownFlow now, not a failed compensation at cancel
        steps = self.replay.store.steps
        with tracing.step_span(name, key):
            while True:
                attempt = await self.replay.durable(
                    "steps.start_attempt", lambda: self.replay.start_attempt(key)
                )
                if attempt is None:
                    raise self.replay.stop(Cause.LOST_FENCE)
                try:
                    with tracing.attempt_span(key, attempt):
                        if limit is not None:
                            output = await call_with_timeout(
                                fn, args, kwargs, timeout=limit, run_id=self.run_id, key=key
                            )
                        elif inspect.iscoroutinefunction(fn):
                            output = await fn(*args, **kwargs)
                        else:
                            output = await in_thread(fn, *args, **kwargs)
                except BaseException as exc:
                    if not isinstance(exc, Exception) and not self.raised_by_user(exc):
                        raise  # runfleet's own stop: the attempt is still in flight
                    error = safe_str(exc, use_repr=True)[:2000]
                    finish = partial(steps.finish_attempt, self.run_id, key, attempt, error)
                    await self.replay.durable("steps.finish_attempt", finish)
                    # A BaseException of the step's own is never retried: it fails the run
                    # (the driver's boundary records it), unless the body catches it.
                    if not isinstance(exc, Exception) or not policy.should_retry(exc, attempt):
                        raise
                    delay = policy.delay(attempt)
                    log.info(
                        "step.retry",
                        extra={
                            "run_id": self.run_id,
                            "step": key,
                            "attempt": attempt,
                            "delay_s": round(delay, 3),
                        },
                    )
                    await self._backoff(key, attempt, delay, policy.park_over)
                    continue
                await self.replay.record(
                    position, key, name, "step", output, compensate=undo, attempt=attempt
                )
                return output

    async def _backoff(self, key: str, attempt: int, delay: float, park_over: float | None) -> None:
        """Wait before a retry: in-process if short, else park on a durable timer."""
        assert self.replay.settings is not None
        if park_over is None:
            park_over = self.replay.settings.park_backoff_over
        if delay <= park_over:
            await asyncio.sleep(delay)
            return
        clock = f"{key}:retry{attempt}"
        due = await self.replay.ensure_clock(clock, await self.replay.now_ms() + int(delay * 1000))
        await self.replay.park(Waiting(reason=WaitingReason.TIMER, wake_at_ms=due), deferred=clock)
