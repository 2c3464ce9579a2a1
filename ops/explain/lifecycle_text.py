"""What ``explain`` says about a run's events and messages (store/events.py,
docs/explanation/lifecycle.md)."""

from __future__ import annotations

from collections import Counter

from runfleet.broker.liveness import FleetMember
from runfleet.ops.cli.common import clock
from runfleet.ops.explain.carriers_text import instance_lines, version_lines
from runfleet.store import Store
from runfleet.store.events import MESSAGE_TOKEN
from runfleet.store.types import RunRow

_SHOWN = 5


async def lifecycle_lines(
    store: Store, row: RunRow, fleet: list[FleetMember] | None = None
) -> list[str]:
    """A line each for the run's version or instance (and the live workers carrying it),
    the events the run set, the messages sent to it and its step attempts that timed out
    (none when there are none)."""
    run_id = row.id
    out: list[str] = version_lines(row, fleet) + instance_lines(row, fleet)
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
    timed_out = await store.timeouts.of_run(run_id)
    if timed_out:
        per_step = Counter(t.key for t in timed_out)
        steps = ", ".join(f"{key!r} {n}x" for key, n in sorted(per_step.items()))
        last = timed_out[-1]
        out.append(
            f"step timeouts: {len(timed_out)} attempt(s) ran past their timeout ({steps}); "
            f"last: attempt {last.attempt} of {last.key!r} at {clock(last.started_at_ms)}."
        )
    return out


def message_topic(row: RunRow) -> str | None:
    """The topic a run parked in ``ctx.recv`` waits on, or None (another wait)."""
    token = row.waiting.token if row.waiting is not None else None
    if token and token.startswith(MESSAGE_TOKEN):
        return token.removeprefix(MESSAGE_TOKEN)
    return None
