"""What a producer may admit: resolving flow targets and checking arguments before any write."""

from __future__ import annotations

import inspect
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from runfleet.declaration import FlowDeclaration, flow_target
from runfleet.declaration.names import load_from_path
from runfleet.producer.trust import already_loaded
from runfleet.store import validate
from runfleet.store.errors import InvalidInput, UnknownFlow
from runfleet.store.types import OnDuplicate, RqOptions, RqRetry


@dataclass(frozen=True)
class EnqueueSpec:
    """One run of an ``enqueue_many`` batch (rq's ``Queue.prepare_data``)."""

    target: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """rq's enqueue options (``job_timeout``, ``meta``, ``retry``, ...): see ``rq_options``."""


def rq_dotted(name: str) -> str | None:
    """rq's ``'module.func'`` spelling as ``module:func``; None unless it is that form.

    A registered flow's name may contain dots too (``@flow(name="billing.charge")``):
    the caller tries the name as given first."""
    if ":" in name or "." not in name:
        return None
    module, _, func = name.rpartition(".")
    return f"{module}:{func}"


def importable(name: str) -> bool:
    """Whether ``module:function`` names a function of a module this process already loaded.

    Never imports: a producer must not run the code of a module a string names
    (``os:system``). Workers decide again by their own allow-list (``worker.resolver``).
    """
    return load_from_path(name, already_loaded) is not None


def unknown(name: str) -> UnknownFlow:
    return UnknownFlow(
        name,
        "no worker has registered it and it is not a function of a module this producer "
        "has loaded (pass late_binding=True to admit it anyway)",
    )


class Retry:
    """rq's ``Retry(max=, interval=)``: try a failing job ``max`` more times.

    ``interval`` is seconds before each retry: one number, or a list whose last
    entry repeats (rq's rule). An ``rq.Retry`` is accepted too (same attributes).
    """

    def __init__(
        self,
        max: int,
        interval: int | float | Sequence[int | float] = 0,
        enqueue_at_front: bool = False,
    ) -> None:
        if max < 1:
            raise InvalidInput("retry", "max: please enter a value greater than 0")
        intervals = [interval] if isinstance(interval, int | float) else list(interval)
        if any(i < 0 for i in intervals):
            raise InvalidInput("retry", "interval: negative numbers are not allowed")
        self.max = max
        self.intervals = intervals
        self.enqueue_at_front = bool(enqueue_at_front)
        """rq's: a retried job goes to the front of its queue. runfleet retries a plain
        function inside the worker that ran it (the run keeps its slot), so every retry
        is already "at the front": accepted, recorded, and true by construction."""

    def __repr__(self) -> str:
        shown = self.intervals[0] if len(self.intervals) == 1 else self.intervals
        return (
            f"Retry(max={self.max}, interval={shown!r}, enqueue_at_front={self.enqueue_at_front})"
        )

    @classmethod
    def get_interval(
        cls, count: int, intervals: int | float | Sequence[int | float] | None
    ) -> int | float:
        """rq's ``Retry.get_interval``: the seconds before retry number ``count`` (from 0):
        one number as it is, a list's entry at ``count`` (its last past the end), 0 for none."""
        if isinstance(intervals, int | float):
            return intervals
        if not intervals:
            return 0
        return list(intervals)[min(len(intervals) - 1, count)]


class Callback:
    """rq's ``Callback(func, timeout=)`` for ``on_success`` / ``on_failure``.

    ``timeout`` is accepted for rq's sake and not enforced: the callback runs as a
    step of the run, under the run's own timeout.
    """

    def __init__(self, func: str | Callable[..., Any], timeout: Any = None) -> None:
        if not isinstance(func, str) and not callable(func):
            raise InvalidInput("callback", "func must be a function or 'module:function'")
        self.func = func
        self.timeout = parse_timeout("timeout", timeout)


def parse_timeout(field: str, value: Any) -> int | None:
    """rq's timeout spellings as whole seconds: a number, ``"90s"``, ``"10m"``, ``"1h"``, ``"2d"``.

    For the TTLs and a callback's timeout, which rq counts in seconds; a run's deadline
    takes ``parse_timeout_ms``, which keeps fractions.
    """
    seconds = _seconds(field, value)
    return None if seconds is None else int(seconds)


def parse_timeout_ms(field: str, value: Any) -> int | None:
    """A timeout in rq's spellings as milliseconds, fractions kept (``0.1`` is 100 ms).

    A positive timeout is at least 1 ms (``store.validate.timeout_ms``).
    """
    seconds = _seconds(field, value)
    return None if seconds is None else validate.timeout_ms(seconds)


def _seconds(field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(field, "must be seconds or a string such as '10m'")
    if isinstance(value, int | float):
        return _bounded_seconds(field, value)
    if isinstance(value, str):
        text = value.strip().lower()
        units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
        try:
            seconds = int(text) if text[-1:].isdigit() else int(text[:-1]) * units[text[-1]]
        except (ValueError, KeyError):
            pass
        else:
            return _bounded_seconds(field, seconds)
    raise InvalidInput(field, f"{reprlib.repr(value)} is not seconds or digits + unit (d, h, m, s)")


MAX_SECONDS = 100 * 365 * 86400
"""The longest timeout or TTL taken (a century): larger is a typo, and would overflow."""


def _bounded_seconds(field: str, value: float) -> float:
    if not math.isfinite(value) or abs(value) > MAX_SECONDS:
        raise InvalidInput(field, f"must be a finite number of seconds up to {MAX_SECONDS}")
    return value


def callback_name(field: str, fn: Any) -> str | None:
    """An ``on_success``/``on_failure`` callback as the ``module:function`` a worker imports."""
    if fn is None:
        return None
    fn = getattr(fn, "func", fn)  # rq.Callback(func, timeout) wraps the function
    if isinstance(fn, str):
        if fn in BUILTIN_CALLBACKS:
            return f"builtins:{fn}"
        if ":" in fn:
            return fn
        module, _, name = fn.rpartition(".")
        if not module:
            raise InvalidInput(field, f"{fn!r} is not 'module.function' nor a builtin rq takes")
        return f"{module}:{name}"
    builtin = getattr(fn, "__name__", None)
    if getattr(fn, "__module__", None) == "builtins" and builtin in BUILTIN_CALLBACKS:
        return f"builtins:{builtin}"
    if not inspect.isfunction(fn) and not isinstance(fn, FlowDeclaration):
        # rq: "Callback `func` must be a function or builtin" (a bound method is neither)
        raise InvalidInput(field, f"{reprlib.repr(fn)} is not a function")
    name = flow_target(fn, elsewhere=False).name  # a callback keeps the name it had
    if isinstance(fn, FlowDeclaration):
        raise InvalidInput(field, "a callback is a plain function, not a flow")
    return name


BUILTIN_CALLBACKS = frozenset({"print"})
"""Builtins a callback may name (rq takes any function or builtin; ``print`` is the one
its documentation uses). Others are refused: a name is resolved in the worker."""


class RqAdmission(NamedTuple):
    """What rq's ``enqueue`` options become (``rq_options``)."""

    options: RqOptions
    """The options the run keeps in its state."""
    timeout_ms: int | None
    """``job_timeout`` in milliseconds, or None."""


def rq_options(
    *,
    ttl: Any = None,
    on_stopped: Any = None,
    allow_failure: bool = False,
    timeout: Any = None,
    job_timeout: Any = None,
    result_ttl: Any = None,
    failure_ttl: Any = None,
    retry: Any = None,
    on_success: Any = None,
    on_failure: Any = None,
    meta: dict[str, Any] | None = None,
    description: str | None = None,
) -> RqAdmission:
    """The options rq's ``enqueue`` options become, and the timeout in milliseconds."""
    if timeout is not None and job_timeout is None:  # enqueue_call's rq 1.x spelling
        job_timeout = timeout
    if job_timeout is not None and not isinstance(job_timeout, bool):
        if isinstance(job_timeout, int | float) and job_timeout == 0:
            raise InvalidInput("job_timeout", "0 is not allowed (rq's rule); -1 means none")
    ttl_s = parse_timeout("ttl", ttl)
    if ttl_s is not None and ttl_s <= 0:
        raise InvalidInput("ttl", "must be a positive number of seconds (rq's rule)")
    if meta is not None and not isinstance(meta, dict):
        raise InvalidInput("meta", "must be a dict")
    result_ttl_s = parse_timeout("result_ttl", result_ttl)
    failure_ttl_s = parse_timeout("failure_ttl", failure_ttl)
    retried = None
    if retry is not None:
        max_tries, intervals = getattr(retry, "max", None), getattr(retry, "intervals", None)
        if not isinstance(max_tries, int) or not isinstance(intervals, list):
            raise InvalidInput("retry", f"{retry!r} is not a Retry(max=, interval=)")
        retried = RqRetry(max_tries, tuple(float(i) for i in intervals))
    callbacks = {
        k: v
        for k, v in (
            ("on_success", callback_name("on_success", on_success)),
            ("on_failure", callback_name("on_failure", on_failure)),
            ("on_stopped", callback_name("on_stopped", on_stopped)),
        )
        if v
    }
    timeouts: dict[str, int] = {}
    if callbacks:
        for k, v in (
            ("on_success", on_success),
            ("on_failure", on_failure),
            ("on_stopped", on_stopped),
        ):
            seconds = parse_timeout(k, getattr(v, "timeout", None)) if v is not None else None
            if seconds is not None:
                timeouts[k] = seconds
    timeout_ms = parse_timeout_ms("job_timeout", job_timeout)
    if timeout_ms is not None and timeout_ms < 0:
        timeout_ms = None  # rq's -1: no timeout
    kept_timeout: int | float | None = None
    if job_timeout is not None:
        given = _seconds("job_timeout", job_timeout)
        kept_timeout = int(given) if given is not None and given == int(given) else given
    options = RqOptions(
        job_timeout=kept_timeout,
        ttl=ttl_s,
        result_ttl=result_ttl_s,
        failure_ttl=failure_ttl_s,
        retry=retried,
        callbacks=callbacks,
        callback_timeouts=timeouts,
        meta=meta,
        description=None if description is None else str(description),
        allow_failure=allow_failure,
    )
    return RqAdmission(options, timeout_ms)


RQ_OPTIONS = (
    "job_timeout",
    "result_ttl",
    "failure_ttl",
    "retry",
    "on_success",
    "on_failure",
    "meta",
    "description",
    "at_front",
    "depends_on",
    "ttl",
    "on_stopped",
    "unique",
    # runfleet's own, not rq's (docs/how-to/queues.md)
    "priority",
    "dedup_key",
    "on_duplicate",
)
QUEUE_OPTIONS = ("priority", "dedup_key", "on_duplicate")
"""Enqueue options that shape the queue (docs/how-to/queues.md), taken out before ``rq_options``."""


def on_duplicate(value: Any) -> OnDuplicate:
    """``on_duplicate=``: "join" (answer the open run) or "refuse" (``DuplicateRun``)."""
    try:
        return OnDuplicate(value)
    except ValueError:
        raise InvalidInput("on_duplicate", f"must be 'join' or 'refuse', got {value!r}") from None


RQ_UNSUPPORTED = ("repeat", "rate_limit", "webhooks", "pipeline")


class RqCall(NamedTuple):
    """An rq-shaped call split (``split_rq_call``): the function's arguments, and the
    enqueue options taken out of its keywords."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def split_rq_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> RqCall:
    """rq's ``parse_args``: the function's args and kwargs, and the enqueue options.

    The option keywords are rq's and are taken out of ``kwargs`` as rq takes them;
    ``args=``/``kwargs=`` given explicitly are the function's arguments. Options
    runfleet does not implement are refused by name rather than passed to the function.
    """
    kwargs = dict(kwargs)
    for name in RQ_UNSUPPORTED:
        if name in kwargs:
            raise InvalidInput(
                name, f"rq's {name}= is not supported (docs/how-to/moving-from-rq.md)"
            )
    options = {k: kwargs.pop(k) for k in RQ_OPTIONS if k in kwargs}
    if "args" in kwargs or "kwargs" in kwargs:
        if args:
            raise InvalidInput("args", "give positional arguments or args=, not both")
        args, given = call_arguments(kwargs.pop("args", None), kwargs.pop("kwargs", None))
        kwargs = given | kwargs
    return RqCall(args, kwargs, options)


def call_arguments(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """rq's explicit ``args=``/``kwargs=`` as a tuple and a dict (None is none), or a
    typed error naming which one is neither a list/tuple nor a mapping."""
    if args is None:
        args = ()
    if kwargs is None:
        kwargs = {}
    if not isinstance(args, list | tuple):
        raise InvalidInput("args", f"must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidInput("kwargs", f"must be a dict, not {type(kwargs).__name__}")
    return tuple(args), dict(kwargs)


def dependency_ids(depends_on: Any) -> list[str]:
    """rq's ``depends_on``: a job, an id, a ``Dependency`` (runfleet's or rq's) or a list
    of any of them, mixed, as ids."""
    return dependencies(depends_on).ids


class Dependencies(NamedTuple):
    """rq's ``depends_on=`` read (``dependencies``)."""

    ids: list[str]
    """The dependencies' ids, in order, each once."""
    allow_failure: bool
    """Whether a failed dependency still meets the gate."""


def dependencies(depends_on: Any) -> Dependencies:
    """The ids, and allow_failure if any ``Dependency`` given says so (rq reads it from
    the one ``Dependency``; a list of them, as rq's, takes it from any)."""
    if depends_on is None:
        return Dependencies([], False)
    top = depends_on if isinstance(depends_on, list | tuple) else [depends_on]
    ids: list[str] = []
    allow = False
    for entry in top:
        inner = getattr(entry, "dependencies", None)  # a Dependency(jobs=[...])
        if inner is not None:
            allow = allow or bool(getattr(entry, "allow_failure", False))
            items = inner if isinstance(inner, list | tuple) else [inner]
        else:
            items = [entry]
        for item in items:
            job_id = item if isinstance(item, str) else getattr(item, "id", None)
            if not isinstance(job_id, str) or not job_id:
                raise InvalidInput("depends_on", f"{item!r} is not a job or a job id")
            if job_id not in ids:
                ids.append(job_id)
    return Dependencies(ids, allow)
