"""How a failed run failed: ``RunError``, the run's ``error`` as the worker records it.

The stored JSON is the contract (``state.error``: ``type``, ``module``, ``message``,
``traceback``, ``base_exception``); this type reads and writes exactly those keys, so
rows written by earlier versions read the same and new ones are written the same.
Reading is a boundary, as for the journal's records: a key this version does not know,
or a known key holding a value of another type, is kept in ``extra`` and written back
unchanged, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TEXTS = ("type", "module", "message", "traceback")


@dataclass(frozen=True, slots=True)
class RunError:
    """The exception a run's body raised (or the reason the store failed the round)."""

    type: str | None = None
    """The exception's class name (``ValueError``), or the store's reason
    (``LineageExhausted``)."""
    module: str | None = None
    """The module the class was defined in (``builtins`` for a builtin)."""
    message: str | None = None
    traceback: str | None = None
    """The traceback formatted in the worker, bounded (its end kept)."""
    base_exception: bool = False
    """The body raised a BaseException that is not an Exception (``SystemExit``...),
    contained by the worker (``worker.containment``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this version does not read into a field, kept as stored."""

    @classmethod
    def from_json(cls, value: Any) -> RunError | None:
        """The error a row's ``state.error`` holds; None when it holds none.

        A value that is not an object (no version writes one; a row edited by hand) reads
        as its text in ``message``."""
        if value is None:
            return None
        if not isinstance(value, dict):
            return cls(message=str(value))
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, item in value.items():
            if key in _TEXTS and isinstance(item, str):
                known[key] = item
            elif key == "base_exception" and item is True:
                known[key] = True
            else:
                extra[key] = item
        return cls(**known, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """The stored object: the fields set, and ``extra``, in the order jsonb keeps
        keys (shorter first, then by bytes), so it reads as the row's own ``error``."""
        out: dict[str, Any] = {
            key: text for key in _TEXTS if (text := getattr(self, key)) is not None
        }
        if self.base_exception:
            out["base_exception"] = True
        out.update(self.extra)
        return dict(sorted(out.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode())))

    def __str__(self) -> str:
        """``Type: message`` (the first line a producer reads)."""
        kind = self.type or "Error"
        return f"{kind}: {self.message}" if self.message else kind
