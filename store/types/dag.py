"""The run DAG's shapes: a parent edge, and what recording one answers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParentEdge:
    child_id: str
    parent_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class EdgeRecorded:
    edge: ParentEdge


@dataclass(frozen=True, slots=True)
class EdgeExisting:
    edge: ParentEdge
