"""The journal's shapes: a record as read, and what emitting one answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from runfleet.store.types.run import JsonValue


@dataclass(frozen=True, slots=True)
class JournalRecord:
    seq: int
    run_id: str
    kind: str
    source_id: str
    source_seq: int
    payload: JsonValue
    at_ms: int


@dataclass(frozen=True, slots=True)
class Accepted:
    seq: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    seq: int


@dataclass(frozen=True, slots=True)
class Conflict:
    seq: int
    existing_payload: JsonValue


EmitOutcome: TypeAlias = Accepted | Duplicate | Conflict
