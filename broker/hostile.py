"""Dropping what Redis hands us that runfleet did not write: count it, log it sparingly, go on.

Anyone with write access to Redis can publish on a channel, append to a stream,
or overwrite a liveness key (DESIGN §11: Redis can delay runs, never decide,
forge or lose them). Every decoding boundary in the broker therefore turns any
defect into one typed "malformed" outcome and reports it here, and every Redis
error *reply* (WRONGTYPE, OOM, READONLY, NOPERM, LOADING) is reported here too.
A flood of garbage must not become a flood of log lines or a CPU sink, so each
event name logs at most once per ``LOG_EVERY_S`` with the count it suppressed,
while the counters see every occurrence.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Literal, TypeAlias

from prometheus_client import Counter
from redis import exceptions as redis_exceptions

Channel: TypeAlias = Literal["cancel", "settled", "stream", "liveness"]

LOG_EVERY_S = 10.0
"""One line per event name per this many seconds; the rest are counted in ``suppressed``."""

HOSTILE_INPUT = Counter(
    "runfleet_hostile_input_total",
    "Payloads read from Redis that runfleet did not write, dropped, by channel.",
    ["channel"],
)
REDIS_ERRORS = Counter(
    "runfleet_broker_redis_errors_total",
    "Redis errors (error replies, timeouts, lost connections) the broker survived, by "
    "component and reply code.",
    ["component", "reply"],
)

_KNOWN_REPLIES = frozenset(
    {
        "WRONGTYPE",
        "OOM",
        "READONLY",
        "NOPERM",
        "NOAUTH",
        "LOADING",
        "BUSY",
        "MASTERDOWN",
        "NOSCRIPT",
        "NOGROUP",
        "CROSSSLOT",
        "MOVED",
        "ASK",
        "TRYAGAIN",
        "CLUSTERDOWN",
        "EXECABORT",
        "ERR",
    }
)


def reply_code(exc: BaseException) -> str:
    """The reply's leading code (``WRONGTYPE``, ``OOM``…), or a bounded stand-in.

    A timeout is ``timeout`` and a lost or refused connection ``unreachable``.

    redis-py maps some codes to subclasses and strips the code from the message,
    so the class name is consulted too. Anything unrecognised is ``other``: the
    label set must stay bounded whatever a server (or a script on it) replies.
    """
    by_class = {
        "ReadOnlyError": "READONLY",
        "NoPermissionError": "NOPERM",
        "AuthenticationError": "NOAUTH",
        "BusyLoadingError": "LOADING",
        "OutOfMemoryError": "OOM",
        "NoScriptError": "NOSCRIPT",
        "ExecAbortError": "EXECABORT",
        "MasterDownError": "MASTERDOWN",
    }
    for cls in type(exc).__mro__:  # before the connection check: LOADING is a ConnectionError
        if cls.__name__ in by_class:
            return by_class[cls.__name__]
    if isinstance(exc, TimeoutError | redis_exceptions.TimeoutError):
        return "timeout"
    if isinstance(exc, OSError | redis_exceptions.ConnectionError):
        return "unreachable"
    head = str(exc).split(" ", 1)[0]
    return head if head in _KNOWN_REPLIES else "other"


class RateLimitedLog:
    """At most one record per event name per ``every`` seconds, carrying the suppressed count.

    Thread-safe: the sync producer API drives the broker from its own loop thread.
    """

    def __init__(self, every: float = LOG_EVERY_S) -> None:
        self._every = every
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, logger: logging.Logger, level: int, event: str, /, **fields: Any) -> bool:
        """Log ``event`` unless it was logged within ``every``; ``True`` if it was."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(event)
            if last is not None and now - last < self._every:
                self._suppressed[event] = self._suppressed.get(event, 0) + 1
                return False
            self._last[event] = now
            suppressed = self._suppressed.pop(event, 0)
        logger.log(level, event, extra={**fields, "suppressed": suppressed})
        return True

    def reset(self) -> None:
        """Forget every event's history (tests)."""
        with self._lock:
            self._last.clear()
            self._suppressed.clear()


rate_limited = RateLimitedLog()
"""The broker's one limiter: an event name is rate-limited process-wide, not per object."""


def dropped(
    logger: logging.Logger, channel: Channel, event: str, reason: str, /, **fields: Any
) -> None:
    """Count and (rate-limited) log one hostile payload on ``channel`` that was dropped.

    The log line carries ``channel`` unless ``fields`` names a more precise one.
    """
    HOSTILE_INPUT.labels(channel).inc()
    line = {"channel": channel, **fields, "reason": _clip(reason)}
    rate_limited(logger, logging.WARNING, event, **line)


def error_reply(
    logger: logging.Logger, component: str, event: str, exc: BaseException, /, **fields: Any
) -> None:
    """Count and (rate-limited) log one Redis error survived by ``component``."""
    REDIS_ERRORS.labels(component, reply_code(exc)).inc()
    rate_limited(logger, logging.WARNING, event, error=_clip(repr(exc)), **fields)


def _clip(text: str, limit: int = 200) -> str:
    """Hostile reasons can quote hostile bytes: keep a log line a line."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
