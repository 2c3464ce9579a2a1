"""The run page's lifecycle card: the version (and class-bound instance) a run was
admitted with, the events it set, the messages sent to it, and the forks and resumes that
link it to other runs (docs/explanation/lifecycle.md). ``/api/runs/<id>/lifecycle`` answers
the same."""

from __future__ import annotations

import json

from runfleet.ops.cli import common as c
from runfleet.ops.dashboard.models import EventView, ForkView, LifecycleView
from runfleet.store.journal import Kind

_PREVIEW = 120
_LINKS_READ = 1_000
"""Journal records read for a run's forks (the newest ones past it are not listed)."""


def _preview(text: str) -> str:
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


async def lifecycle(conns: c.Connections, run_id: str) -> LifecycleView:
    row = await conns.run_row(run_id)  # the caller's policies decide, as for every part
    store = conns.store
    events = [
        EventView(
            key=e.key,
            version=e.version,
            set_at_ms=e.set_at_ms,
            value=_preview(json.dumps(e.value, ensure_ascii=False)),
        )
        for e in await store.events.of_run(run_id)
    ]
    messages = await store.events.messages_of_run(run_id)
    forks: list[ForkView] = []
    for r in await store.journal.records(run_id, limit=_LINKS_READ):
        p = r.payload if isinstance(r.payload, dict) else {}
        if r.kind in (Kind.FORKED, Kind.RESUMED_AS) and isinstance(p.get("to"), str):
            forks.append(
                ForkView(
                    run_id=p["to"],
                    kind="fork" if r.kind == Kind.FORKED else "resumed-as",
                    calls=p.get("calls") if isinstance(p.get("calls"), int) else None,
                    actor=_text(p.get("actor")),
                    note=_text(p.get("note")),
                    at_ms=r.at_ms,
                )
            )
    state = row.state
    return LifecycleView(
        run_id=run_id,
        version=_text(state.get("flow_version")),
        instance=_text(state.get("flow_instance")),
        forked_from=_text(state.get("forked_from")),
        resumed_from=_text(state.get("resumed_from")),
        resumed_as=_text(state.get("resumed_as")),
        replays=state.get("replays") if isinstance(state.get("replays"), int) else None,
        events=events,
        messages_sent=len(messages),
        messages_received=sum(1 for m in messages if m.consumed_at_ms is not None),
        forks=forks,
    )
