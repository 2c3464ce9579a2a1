"""What ``explain`` says about a run's events and messages (store/events.py, docs/lifecycle.md)."""

from __future__ import annotations

from collections import Counter

from ops.cli.common import clock
from store import Store
from store.events import MESSAGE_TOKEN
from store.types import RunRow

_SHOWN = 5


async def lifecycle_lines(store: Store, run_id: str) -> list[str]:
    """One line for the events the run set, one for the messages sent to it (if any)."""
    out: list[str] = []
    events = await store.events.of_run(run_id)
    if events:
        shown = ", ".join(
            f"{e.key!r} (set {e.version}x, last at {clock(e.set_at_ms)})" for e in events[:_SHOWN]
        )
        more = f" and {len(events) - _SHOWN} more" if len(events) > _SHOWN else ""
        out.append(f"events: {shown}{more}.")
    messages = await store.events.messages_of_run(run_id)
    if messages:
        waiting = Counter(m.topic for m in messages if m.consumed_at_ms is None)
        taken = sum(1 for m in messages if m.consumed_at_ms is not None)
        pending = ", ".join(f"{n} on {topic!r}" for topic, n in sorted(waiting.items()))
        out.append(
            f"messages: {len(messages)} sent, {taken} received"
            + (f", not yet received: {pending}" if pending else "")
            + "."
        )
    return out


def message_topic(row: RunRow) -> str | None:
    """The topic a run parked in ``ctx.recv`` waits on, or None (another wait)."""
    token = row.waiting.token if row.waiting is not None else None
    if token and token.startswith(MESSAGE_TOKEN):
        return token.removeprefix(MESSAGE_TOKEN)
    return None
