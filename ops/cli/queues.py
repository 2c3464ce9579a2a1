"""``runfleet queue set/show``: a queue's fleet-wide limits and default priority, live.

``set`` changes them in the database (``store.queues``): every worker's next claim obeys
the new concurrency and every producer's next admission the new default priority; no
process restarts. Each change is journaled with the database role that made it.
``show`` prints the settings, the slots in use (runs executing now) and the latest changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from pydantic import BaseModel

from runfleet.ops.cli import common as c
from runfleet.ops.cli.text import say
from runfleet.store.config import Settings
from runfleet.store.errors import RunfleetError
from runfleet.store.queues import QueueSettings, key_label

queue_app = typer.Typer(
    no_args_is_help=True, help="Queues that shape load: fleet-wide concurrency, priorities."
)
Name = Annotated[str, typer.Argument(help="The queue's name.")]


class QueueChangeInfo(BaseModel):
    change: dict[str, object]
    note: str | None
    changed_by: str
    at: str


class KeyInfo(BaseModel):
    key: str
    running: int
    """The key's slots in use."""
    waiting: int
    """Its fresh admissions not started yet."""
    next_token_ms: int | None
    """Until the key's rate allows a start (None: no key rate)."""


class QueueInfo(BaseModel):
    """One queue as ``runfleet queue show --json`` prints it (fields are only added)."""

    name: str
    concurrency: int | None
    """Fleet-wide limit; None: unlimited."""
    rate_per_s: float | None
    """Fleet-wide starts per second; None: no rate."""
    running: int
    """Runs of the queue executing now: the slots in use."""
    keyed: bool = False
    key_concurrency: int | None = None
    key_rate_per_s: float | None = None
    key_flows: dict[str, str] = {}
    """The flows keyed on this queue's runs and their expressions."""
    keys: list[KeyInfo] = []
    """Its keys in round-robin order (the next turn first; at most 20)."""
    default_priority: int
    updated_by: str
    changes: list[QueueChangeInfo]


class QueueList(BaseModel):
    queues: list[QueueInfo]


def register(app: typer.Typer) -> None:
    app.add_typer(queue_app, name="queue")


@queue_app.command("set")
def set_(
    name: Name,
    concurrency: Annotated[
        int | None,
        typer.Option(help="At most this many runs of the queue at once, fleet-wide; 0 lifts it."),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(help="At most R starts per period, fleet-wide: R/s, R/m or R/h; 0 lifts it."),
    ] = None,
    default_priority: Annotated[
        int | None, typer.Option(help="Priority of admissions that name none (higher first).")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="FLOW=EXPR: the flow's concurrency key (scope, kwargs.NAME or args.N); the "
            "queue's slots are then shared round-robin across keys."
        ),
    ] = None,
    key_concurrency: Annotated[
        int | None, typer.Option(help="At most this many runs of one key at once; 0 lifts it.")
    ] = None,
    key_rate: Annotated[
        str | None, typer.Option(help="At most R starts per period per key (R/s, R/m, R/h).")
    ] = None,
    note: Annotated[str | None, typer.Option(help="Why, kept with the change.")] = None,
) -> None:
    """Change a queue's limits live (journaled with the database role that did it)."""
    per_s = None if rate is None else parse_rate(rate)
    key_per_s = None if key_rate is None else parse_rate(key_rate)
    key_flow = None
    if key is not None:
        flow, sep, expression = key.rpartition("=")
        if not sep or not flow:
            c.fail(f"--key {key!r}: expected FLOW=EXPR (e.g. billing.invoice=kwargs.tenant)")
        key_flow = (flow, expression)
    limits = KeyLimits(key_flow, key_concurrency, key_per_s)
    c.run(_set(c.settings(), name, concurrency, per_s, default_priority, note, limits))


@dataclass(frozen=True, slots=True)
class KeyLimits:
    flow: tuple[str, str] | None
    concurrency: int | None
    rate_per_s: float | None


PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(text: str) -> float:
    """``R/s``, ``R/m``, ``R/h`` (or a bare ``R``: per second) as starts per second."""
    count, _, period = text.strip().partition("/")
    try:
        value = float(count)
    except ValueError:
        c.fail(f"--rate {text!r}: expected R/s, R/m or R/h (e.g. 5/s)")
    if period and period not in PERIODS:
        c.fail(f"--rate {text!r}: the period is s, m or h")
    return value / PERIODS[period or "s"]


async def _set(
    cfg: Settings,
    name: str,
    concurrency: int | None,
    rate_per_s: float | None,
    priority: int | None,
    note: str | None,
    keys: KeyLimits,
) -> None:
    async with c.connect(cfg) as conns:
        try:
            q = await conns.store.queues.set(
                name,
                concurrency=concurrency,
                rate_per_s=rate_per_s,
                default_priority=priority,
                key_flow=keys.flow,
                key_concurrency=keys.concurrency,
                key_rate_per_s=keys.rate_per_s,
                note=note,
            )
        except RunfleetError as exc:
            c.fail(str(exc))
        say(_line(q, None))


@queue_app.command("show")
def show(
    name: Annotated[
        str | None, typer.Argument(help="One queue (default: every configured one).")
    ] = None,
    as_json: c.AsJson = False,
) -> None:
    """Settings, slots in use and the latest changes of configured queues."""
    c.run(_show(c.settings(), name, as_json))


async def _show(cfg: Settings, name: str | None, as_json: bool) -> None:
    async with c.connect(cfg) as conns:
        queues = conns.store.queues
        found = [await queues.get(name)] if name else await queues.all()
        listed = [q for q in found if q is not None]
        if name and not listed:
            c.fail(f"queue {name!r} has no settings (it runs unlimited, priority 0)")
        running = await queues.running([q.name for q in listed])
        flow_keys = await queues.flow_keys()
        history = await queues.changes_readable()
        infos = []
        for q in listed:
            keys = [
                KeyInfo(key=k.key, running=k.running, waiting=k.waiting, next_token_ms=k.wait_ms)
                for k in (await queues.keys(q.name) if q.keyed else [])
            ]
            changes = [
                QueueChangeInfo(
                    change=ch.change, note=ch.note, changed_by=ch.changed_by, at=c.stamp(ch.at_ms)
                )
                for ch in (await queues.changes(q.name, limit=5) if history else [])
            ]
            infos.append(
                QueueInfo(
                    name=q.name,
                    concurrency=q.concurrency,
                    rate_per_s=q.rate_per_s,
                    running=running[q.name],
                    keyed=q.keyed,
                    key_concurrency=q.key_concurrency,
                    key_rate_per_s=q.key_rate_per_s,
                    key_flows=flow_keys if q.keyed else {},
                    keys=keys,
                    default_priority=q.default_priority,
                    updated_by=q.updated_by,
                    changes=changes,
                )
            )
    if as_json:
        c.emit(QueueList(queues=infos))
        return
    for info, q in zip(infos, listed, strict=True):
        say(_line(q, info.running))
        if info.keyed:
            by = ", ".join(f"{flow} by {expr}" for flow, expr in sorted(info.key_flows.items()))
            say(f"  keys: {by or '(no flow keyed yet)'}; round-robin, next turn first:")
            for k in info.keys:
                token = "" if k.next_token_ms is None else f", next token in {k.next_token_ms} ms"
                say(f"    {key_label(k.key)}: {k.running} running, {k.waiting} waiting{token}")
        for ch in info.changes:
            say(f"  {ch.at}  {ch.changed_by}: {ch.change}" + (f" ({ch.note})" if ch.note else ""))


def _line(q: QueueSettings, running: int | None) -> str:
    limit = "unlimited" if q.concurrency is None else f"concurrency {q.concurrency}"
    if running is not None:
        limit += f", {running} running" if q.concurrency is None else f", {running} in use"
    rate = "" if q.rate_per_s is None else f", rate {q.rate_per_s:g}/s"
    return f"queue {q.name}: {limit}{rate}{key_words(q)}, default priority {q.default_priority}"


def key_words(q: QueueSettings) -> str:
    """The key limits of a queue, as its one-line summaries say them."""
    if not q.keyed:
        return ""
    per = [f"{q.key_concurrency} per key"] if q.key_concurrency is not None else []
    if q.key_rate_per_s is not None:
        per.append(f"{q.key_rate_per_s:g}/s per key")
    return ", keyed (round-robin" + "".join(f", {p}" for p in per) + ")"
