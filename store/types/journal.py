"""The journal's shapes: a record as read, and what emitting one answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from runfleet.store.types.run import JsonValue

if TYPE_CHECKING:  # store.journal_records builds on store.types.run: for annotations only
    from runfleet.store.journal_records import Kind


@dataclass(frozen=True, slots=True)
class JournalRecord:
    seq: int
    run_id: str
    kind: Kind | str
    """A ``Kind`` where this version knows it; a kind it does not (a newer version's, one
    written by hand) stays the stored string, so such a record still reads."""
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
