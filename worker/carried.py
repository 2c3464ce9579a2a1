"""What a worker advertises on its liveness key about the runs it may take: the versions
its versioned flows carry and the instances its class-bound flows have (``runfleet
explain`` names the live workers that carry a waiting run's version or instance).

Two info fields, each a compact JSON object keyed by flow name (absent when empty):
``versions`` (``{flow: [version, *compatible]}``) and ``instances`` (``{flow: [name...]}``).
Two more, each a JSON list: ``flows`` (the registered flow names) and ``imports`` (the
modules and ``--allow-import`` prefixes whose plain functions it may run), so ``runfleet
stuck`` can name a pending run no live worker of its queue could run (``can_run``).
They are computed once, when the worker starts (flows and instances are made at import
of its ``--flows`` modules), and bounded: past ``LIMIT`` characters the rest is left out
(``truncated`` says so), so a key stays far below ``MAX_VALUE_BYTES``.
"""

from __future__ import annotations

import json

import runfleet.worker.authoring.instances as instances
from runfleet.broker.liveness_keys import InfoValue
from runfleet.worker.authoring.flows import registered
from runfleet.worker.resolver import flow_modules, import_prefixes

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
    imports = sorted({*flow_modules(), *import_prefixes()})
    for field, names in (("flows", sorted(registered())), ("imports", imports)):
        listed = json.dumps(names, separators=(",", ":"))
        if len(listed) > LIMIT:
            out["truncated"] = True  # a partial list would name runs nobody could run
            continue
        out[field] = listed
    return out


def can_run(info: dict[str, InfoValue], flow: str) -> bool | None:
    """Whether a worker that advertised ``info`` may run ``flow``: a flow it registered,
    or a ``module:function`` of a module it may import. None: it did not say (an older
    worker, a truncated or garbled list). A flow name it has may still be refused for a
    version or an instance (``explain`` tells those); a module may still fail to import
    (its ``flow.import_failed`` line)."""
    if info.get("truncated"):
        return None
    flows, imports = _names(info, "flows"), _names(info, "imports")
    if flows is None or imports is None:
        return None
    if flow in flows:
        return True
    module = flow.partition(":")[0] if ":" in flow else None
    return module is not None and any(module == p or module.startswith(p + ".") for p in imports)


def _names(info: dict[str, InfoValue], field: str) -> list[str] | None:
    raw = info.get(field)
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return [str(x) for x in value] if isinstance(value, list) else None


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
