"""What a worker advertises on its liveness key about the runs it may take: the versions
its versioned flows carry and the instances its class-bound flows have (``runfleet
explain`` names the live workers that carry a waiting run's version or instance).

Two info fields, each a compact JSON object keyed by flow name (absent when empty):
``versions`` (``{flow: [version, *compatible]}``) and ``instances`` (``{flow: [name...]}``).
They are computed once, when the worker starts (flows and instances are made at import
of its ``--flows`` modules), and bounded: past ``LIMIT`` characters the rest is left out
(``truncated`` says so), so a key stays far below ``MAX_VALUE_BYTES``.
"""

from __future__ import annotations

import json

from runfleet.broker.liveness_keys import InfoValue
from runfleet.worker import instances
from runfleet.worker.flows import registered

LIMIT = 4096
"""The characters each field may take."""


def _bounded(entries: dict[str, list[str]]) -> tuple[str | None, bool]:
    kept: dict[str, list[str]] = {}
    for name in sorted(entries):
        trial = {**kept, name: entries[name]}
        if len(json.dumps(trial, separators=(",", ":"))) > LIMIT:
            return json.dumps(kept, separators=(",", ":")), True
        kept = trial
    return (json.dumps(kept, separators=(",", ":")) if kept else None), False


def advertised() -> dict[str, InfoValue]:
    """The liveness info fields for this process's flows (none when nothing is versioned
    or class-bound)."""
    versions: dict[str, list[str]] = {}
    bound: dict[str, list[str]] = {}
    for name, f in registered().items():
        if f.version is not None:
            versions[name] = [f.version, *f.compatible]
        if f.owner is not None:
            bound[name] = instances.instances(f.owner)
    out: dict[str, InfoValue] = {}
    for field, entries in (("versions", versions), ("instances", bound)):
        text, cut = _bounded(entries)
        if text is not None:
            out[field] = text
        if cut:
            out["truncated"] = True
    return out


def read(info: dict[str, InfoValue], field: str) -> dict[str, list[str]] | None:
    """A member's ``field`` as advertised (None: it advertised nothing, or garbage)."""
    raw = info.get(field)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {
        str(k): [str(x) for x in v if isinstance(x, str)]
        for k, v in value.items()
        if isinstance(v, list)
    }
