"""What an admission records in a run's state beyond its columns: ``AdmissionOptions``.

One field per stored key (``state()`` writes them under the names every version wrote,
docs/reference/rq-compat.md and docs/how-to/versioning.md), grouped by who sets them:
rq's enqueue options (``RqOptions``), the ``@flow`` declaration the run was admitted
with (its version and instance), the producer's trace context, and where the run came
from (``Requeued``, ``Forked``, ``Resumed``, a schedule's ``Tick``).

Reading one back from a row (``from_state``, for the options a requeued, resumed or
forked round keeps) reads a value of another type as absent, as ``RunRow``'s readers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

JsonValue: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class RqRetry:
    """rq's ``Retry(max=, interval=)``: how often a failed job is tried again, and after
    how many seconds each time."""

    max: int
    intervals: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class RqOptions:
    """rq's enqueue options as the run keeps them (``broker.admission.rq_options``)."""

    job_timeout: int | float | None = None
    """Seconds as given (``-1``: none); the deadline it implies is the run's own column."""
    ttl: int | None = None
    result_ttl: int | None = None
    failure_ttl: int | None = None
    retry: RqRetry | None = None
    callbacks: Mapping[str, str] = field(default_factory=dict)
    """``on_success`` / ``on_failure`` / ``on_stopped``: the stored function names."""
    callback_timeouts: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping[str, JsonValue] | None = None
    description: str | None = None
    allow_failure: bool = False
    at_front: bool = False
    """rq's ``at_front``: the run goes before its queue's others in rq's ``job_ids``."""
    dependency_ids: tuple[str, ...] = ()
    """Every run it was enqueued to depend on."""
    depends_on: tuple[str, ...] = ()
    """Those not settled yet at admission: the run waits for them."""

    def state(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {}
        if self.ttl is not None:
            out["ttl"] = self.ttl
        if self.allow_failure:
            out["allow_failure"] = True
        if self.meta is not None:
            out["meta"] = dict(self.meta)
        if self.description is not None:
            out["description"] = self.description
        if self.result_ttl is not None:
            out["result_ttl"] = self.result_ttl
        if self.failure_ttl is not None:
            out["failure_ttl"] = self.failure_ttl
        if self.retry is not None:
            out["retry"] = {"max": self.retry.max, "intervals": list(self.retry.intervals)}
        if self.callbacks:
            out["callbacks"] = dict(self.callbacks)
        if self.callback_timeouts:
            out["callback_timeouts"] = dict(self.callback_timeouts)
        if self.job_timeout is not None:
            out["job_timeout"] = self.job_timeout
        if self.at_front:
            out["at_front"] = True
        if self.dependency_ids:
            out["dependency_ids"] = list(self.dependency_ids)
        if self.depends_on:
            out["depends_on"] = list(self.depends_on)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, JsonValue]) -> RqOptions:
        retry = state.get("retry")
        kept_retry = None
        if isinstance(retry, dict):
            tries, intervals = retry.get("max"), retry.get("intervals")
            tries = _int(tries)
            if tries is not None and isinstance(intervals, list):
                if all(map(_is_number, intervals)):
                    kept_retry = RqRetry(tries, tuple(intervals))
        job_timeout = state.get("job_timeout")
        meta = state.get("meta")
        description = state.get("description")
        return cls(
            job_timeout=job_timeout if _is_number(job_timeout) else None,
            ttl=_int(state.get("ttl")),
            result_ttl=_int(state.get("result_ttl")),
            failure_ttl=_int(state.get("failure_ttl")),
            retry=kept_retry,
            callbacks=_mapping(state.get("callbacks"), str),
            callback_timeouts=_mapping(state.get("callback_timeouts"), int),
            meta=meta if isinstance(meta, dict) else None,
            description=description if isinstance(description, str) else None,
            allow_failure=state.get("allow_failure") is True,
            at_front=state.get("at_front") is True,
            dependency_ids=_ids(state.get("dependency_ids")),
            depends_on=_ids(state.get("depends_on")),
        )


@dataclass(frozen=True, slots=True)
class Requeued:
    """rq's ``requeue``: a new round of a failed run (``store.jobs``)."""

    run_id: str
    actor: str | None


@dataclass(frozen=True, slots=True)
class Forked:
    """A new lineage replaying the first ``replays`` calls of ``run_id`` (``store.forks``)."""

    run_id: str
    replays: int


@dataclass(frozen=True, slots=True)
class Resumed:
    """The next round of a failed or cancelled run, replaying its records (``store.forks``)."""

    run_id: str
    replays: int


@dataclass(frozen=True, slots=True)
class Tick:
    """A schedule's tick (``store.schedules``); ``late``: caught up after an outage."""

    schedule: str
    tick_ms: int
    late: bool


Origin: TypeAlias = Requeued | Forked | Resumed | Tick


@dataclass(frozen=True, slots=True)
class AdmissionOptions:
    """Everything an admission keeps in the run's state besides the request's columns."""

    rq: RqOptions = field(default_factory=RqOptions)
    flow_version: str | None = None
    """The ``@flow(version=)`` the run was admitted with (docs/how-to/versioning.md)."""
    flow_instance: str | None = None
    """The instance of a class-bound ``@flow`` it was admitted for."""
    trace: Mapping[str, str] | None = None
    """The admitting span's W3C carrier (``traceparent``/``tracestate``), with ``otel``."""
    origin: Origin | None = None

    def state(self) -> dict[str, JsonValue]:
        """The run-state keys these options set (none for the defaults)."""
        out = self.rq.state()
        if self.trace is not None:
            out["trace"] = dict(self.trace)
        if self.flow_version is not None:
            out["flow_version"] = self.flow_version
        if self.flow_instance is not None:
            out["flow_instance"] = self.flow_instance
        match self.origin:
            case Requeued(run_id=run_id, actor=actor):
                out.update(requeued_from=run_id, requeued_by=actor)
            case Forked(run_id=run_id, replays=replays):
                out.update(forked_from=run_id, replays=replays)
            case Resumed(run_id=run_id, replays=replays):
                out.update(resumed_from=run_id, replays=replays)
            case Tick(schedule=schedule, tick_ms=tick_ms, late=late):
                out.update(schedule=schedule, tick_ms=tick_ms, late=late)
            case None:
                pass
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, JsonValue]) -> AdmissionOptions:
        """The options a stored run was admitted with, as far as a later round keeps them
        (its origin is its own, never carried)."""
        version, instance = state.get("flow_version"), state.get("flow_instance")
        return cls(
            rq=RqOptions.from_state(state),
            flow_version=version if isinstance(version, str) else None,
            flow_instance=instance if isinstance(instance, str) else None,
        )


def _is_int(value: JsonValue) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: JsonValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: JsonValue) -> int | None:
    return value if _is_int(value) else None


def _ids(value: JsonValue) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _mapping(value: JsonValue, kind: type) -> dict[str, Any]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, kind) and not isinstance(v, bool)}
