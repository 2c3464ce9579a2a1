"""What ``explain`` says about a run's events and messages (store/events.py, docs/lifecycle.md)."""

from __future__ import annotations

from collections import Counter

from runfleet.ops.cli.common import clock
from runfleet.store import Store
from runfleet.store.events import MESSAGE_TOKEN
from runfleet.store.types import RunRow, RunStatus, WaitingReason

_SHOWN = 5


async def lifecycle_lines(store: Store, row: RunRow) -> list[str]:
    """A line each for the events the run set, the messages sent to it and its step
    attempts that timed out (none when there are none)."""
    run_id = row.id
    out: list[str] = _version_lines(row)
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


def _version_lines(row: RunRow) -> list[str]:
    """What the run's flow version means for who may take it (``worker.versions``)."""
    version = row.state.get("flow_version")
    if not isinstance(version, str):
        return []
    line = (
        f"version: admitted with version {version!r} of {row.flow}; only a worker whose "
        f"@flow carries {version!r} (or lists it as compatible) takes it"
    )
    if row.status is RunStatus.PENDING or (
        row.status is RunStatus.SUSPENDED
        and row.waiting is not None
        and row.waiting.reason == WaitingReason.RELEASED
    ):
        line += f" — it waits for a worker of version {version!r}"
    return [line + "."]


def message_topic(row: RunRow) -> str | None:
    """The topic a run parked in ``ctx.recv`` waits on, or None (another wait)."""
    token = row.waiting.token if row.waiting is not None else None
    if token and token.startswith(MESSAGE_TOKEN):
        return token.removeprefix(MESSAGE_TOKEN)
    return None
