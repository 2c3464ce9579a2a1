"""The stream message: a validated msgpack map, and its one encoder and decoder.

A message only ever *hints* that a run wants attention; Postgres holds what the
run is. So a message that cannot be decoded is never fatal: the reader logs,
acknowledges and drops it, and the Postgres sweeps recover whatever it meant.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runfleet.broker.wake_reasons import WakeReason
from runfleet.store.errors import RunfleetError

FIELD = b"m"
"""Stream entries carry the packed message under this single field."""

_MAX_MESSAGE_BYTES = 64 * 1024
"""Far above any real message (two ids, a reason, a timestamp): larger input is garbage."""

_MAX_BIGINT = 2**63 - 1


class MalformedMessage(RunfleetError):
    """Bytes read from a stream are not a valid runfleet message; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed stream message: {reason}")
        self.reason = reason


class StreamMessage(BaseModel):
    """``schedule`` asks a worker to start a pending run; ``wake`` to resume a parked one.

    Strict: msgpack already gives native types, so any coercion would be hiding a
    producer bug. Unknown extra keys are ignored so that a newer producer may add
    an optional field during a rolling deploy; incompatible changes bump ``v``
    (an old worker drops such messages and the sweeps cover them).
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    v: Literal[1] = 1
    kind: Literal["schedule", "wake"]
    run: str = Field(min_length=1, max_length=255)
    flow: str = Field(min_length=1, max_length=255)
    reason: str
    at_ms: int = Field(ge=0, le=_MAX_BIGINT)

    @field_validator("v", mode="before")
    @classmethod
    def _exact_int_version(cls, value: Any) -> Any:
        # Literal[1] alone accepts True and 1.0 (they compare equal to 1).
        if type(value) is not int:
            raise ValueError("v must be the integer 1")
        return value


def message_for(
    run_id: str, flow: str, reason: WakeReason, kind: Literal["schedule", "wake"] = "wake"
) -> StreamMessage:
    """The one way runfleet builds a stream message: the current version, stamped now."""
    return StreamMessage(
        v=1, kind=kind, run=run_id, flow=flow, reason=reason, at_ms=int(time.time() * 1000)
    )


def encode(msg: StreamMessage) -> bytes:
    """Pack a message for the stream field ``m``."""
    packed: bytes = msgpack.packb(msg.model_dump(mode="python"), use_bin_type=True)
    return packed


def decode(data: bytes) -> StreamMessage:
    """Unpack and validate one stream field value; raise ``MalformedMessage`` on any defect.

    Contract: whatever the bytes (any length, nesting, encoding, type), this raises
    nothing but ``MalformedMessage``: a reader that catches it survives anything a
    Redis writer can put on a stream. Size is checked before parsing, and msgpack's
    own nesting limit (a ``StackError``) turns a deep structure into a defect.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedMessage(f"expected bytes, got {type(data).__name__}")
    if len(data) > _MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"{len(data)} bytes exceeds {_MAX_MESSAGE_BYTES}")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedMessage(f"not msgpack: {str(exc) or type(exc).__name__}") from exc
    except (RecursionError, MemoryError, TypeError, OverflowError) as exc:
        raise MalformedMessage(f"not msgpack: {type(exc).__name__}") from exc
    if not isinstance(raw, dict):
        raise MalformedMessage(f"not a map: msgpack {type(raw).__name__}")
    try:
        return StreamMessage.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise MalformedMessage(f"invalid fields: {problems[:500]}") from exc
    except Exception as exc:  # a validator tripping on something pydantic did not foresee
        raise MalformedMessage(f"invalid fields: {type(exc).__name__}") from exc
