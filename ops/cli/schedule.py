"""``runfleet schedule add/list/pause/resume/remove``: periodic runs from a shell.

The same store operations the workers use (``store.schedules``): what an operator
adds here, every worker's scheduler fires, once per tick across the fleet. A bad
cron expression or time zone is one line on stderr (``InvalidSchedule``), exit 1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from pydantic import BaseModel

from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import CATCH_UP_MAX
from runfleet.ops.cli.produce import Scopes, parse_payload
from runfleet.ops.cli.text import say
from runfleet.producer.admission import importable, unknown
from runfleet.store.config import Settings
from runfleet.store.cron import Cron, iso
from runfleet.store.errors import RunfleetError
from runfleet.store.schedules import Overlap, Schedule, Schedules, ScheduleSpec, overlap_of

schedule_app = typer.Typer(
    no_args_is_help=True, help="Periodic runs: cron expressions in a time zone, DST-safe."
)
T = TypeVar("T")
Name = Annotated[str, typer.Argument(help="The schedule's name (a decorated flow's: its name).")]


class ScheduleInfo(BaseModel):
    """One schedule as ``runfleet schedule list --json`` prints it (fields are only added)."""

    name: str
    flow: str
    queue: str
    cron: str
    timezone: str
    payload: object
    scopes: list[str]
    catch_up: int
    overlap: str
    origin: str
    paused: bool
    next_tick_ms: int
    next_tick: str
    last_tick_ms: int | None
    last_run_id: str | None
    admitted: int
    missed: int
    overlapped: int


class ScheduleList(BaseModel):
    schedules: list[ScheduleInfo]
    now_ms: int
    """Database time of the listing (0 when there is no schedule)."""


def info(s: Schedule) -> ScheduleInfo:
    spec = s.spec
    return ScheduleInfo(
        name=spec.name,
        flow=spec.flow,
        queue=spec.queue,
        cron=spec.cron.expression,
        timezone=spec.cron.timezone,
        payload=spec.payload,
        scopes=list(spec.scopes),
        catch_up=spec.catch_up,
        overlap=spec.overlap.value,
        origin=spec.origin.value,
        paused=s.paused,
        next_tick_ms=s.next_tick_ms,
        next_tick=iso(s.next_tick_ms),
        last_tick_ms=s.last_tick_ms,
        last_run_id=s.last_run_id,
        admitted=s.admitted,
        missed=s.missed,
        overlapped=s.overlapped,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(schedule_app, name="schedule")


def _line(s: Schedule) -> str:
    state = "paused" if s.paused else f"next {c.stamp(s.next_tick_ms)}"
    return f"{s.name}: {s.spec.cron.expression} ({s.spec.cron.timezone}) -> {s.spec.flow}, {state}"


@schedule_app.command("add")
def add(
    name: Name,
    flow: Annotated[str, typer.Option("--flow", help="Flow name (as registered by workers).")],
    cron: Annotated[
        str,
        typer.Option("--cron", help="'*/5 * * * *'; 6 fields = seconds first; @hourly, @daily"),
    ],
    timezone: Annotated[str, typer.Option(help="IANA time zone of the wall times.")] = "UTC",
    queue: Annotated[str, typer.Option(help="Queue the runs are admitted to.")] = "default",
    payload: Annotated[
        str | None,
        typer.Option(help='JSON: {"args": [...], "kwargs": {...}}, a list, or an object.'),
    ] = None,
    scope: Scopes = None,
    catch_up: Annotated[
        int,
        typer.Option(
            min=0, max=CATCH_UP_MAX, help="Ticks missed while no worker ran to admit (0 = skip)."
        ),
    ] = 0,
    overlap: Annotated[
        str, typer.Option(help="allow, or skip a tick while the previous run is open.")
    ] = Overlap.ALLOW.value,
    late_binding: Annotated[
        bool,
        typer.Option("--late-binding", help="Accept a flow name no worker has registered (yet)."),
    ] = False,
    as_json: c.AsJson = False,
) -> None:
    """Add a schedule; its first tick is the first after now (database time).

    The flow must be registered by a worker (or be an importable ``module:function``),
    as for ``enqueue``: a typo would otherwise admit a run nobody can execute every tick.
    """
    try:
        args, kwargs = parse_payload(payload)
        spec = ScheduleSpec(
            name=name,
            flow=flow,
            cron=Cron(cron, timezone),
            queue=queue,
            payload={"args": args, "kwargs": kwargs},
            scopes=tuple(scope or ()),
            catch_up=catch_up,
            overlap=overlap_of(overlap),
        )
    except RunfleetError as exc:
        c.fail(str(exc))
    added = c.run(_add(c.settings(), spec, late_binding))
    if added is None:
        c.fail(f"schedule {name!r} already exists (remove it first)")
    _print(added, as_json)


@schedule_app.command("list")
def list_(as_json: c.AsJson = False) -> None:
    """Every schedule: cron, time zone, flow, next tick, and ticks admitted / skipped."""
    found = c.run(_list(c.settings()))
    if as_json:
        c.emit(
            ScheduleList(schedules=[info(s) for s in found], now_ms=found[0].now_ms if found else 0)
        )
        return
    if not found:
        say("no schedules")
        return
    for s in found:
        say(
            f"{_line(s)}; admitted {s.admitted}, missed {s.missed}, overlapped {s.overlapped}"
            f", catch-up {s.spec.catch_up}, overlap {s.spec.overlap.value}"
        )


@schedule_app.command("pause")
def pause(name: Name, as_json: c.AsJson = False) -> None:
    """Stop admitting runs; a paused schedule's ticks are not missed, they never come."""
    _print(_one(name, c.run(_call(c.settings(), lambda s: s.pause(name)))), as_json)


@schedule_app.command("resume")
def resume(name: Name, as_json: c.AsJson = False) -> None:
    """Admit runs again, from the first tick after now."""
    _print(_one(name, c.run(_call(c.settings(), lambda s: s.resume(name)))), as_json)


@schedule_app.command("remove")
def remove(name: Name) -> None:
    """Delete a schedule (its runs stay). A decorated flow's comes back at the next worker
    start: drop ``schedule=`` from the code to retire it."""
    if not c.run(_call(c.settings(), lambda s: s.remove(name))):
        c.fail(f"no schedule named {name!r}")
    say(f"removed schedule {name}")


def _one(name: str, found: Schedule | None) -> Schedule:
    if found is None:
        c.fail(f"no schedule named {name!r}")
    return found


def _print(s: Schedule, as_json: bool) -> None:
    if as_json:
        c.emit(info(s))
    else:
        say(_line(s))


async def _call(cfg: Settings, op: Callable[[Schedules], Awaitable[T]]) -> T:
    async with c.connect(cfg) as conns:
        return await op(Schedules.of(conns.store))


async def _add(cfg: Settings, spec: ScheduleSpec, late_binding: bool) -> Schedule | None:
    async with c.connect(cfg) as conns:
        if not late_binding and not importable(spec.flow):
            if await conns.store.flows.get(spec.flow) is None:
                raise unknown(spec.flow)
        return await Schedules.of(conns.store).add(spec)


async def _list(cfg: Settings) -> list[Schedule]:
    async with c.connect(cfg) as conns:
        return await Schedules.of(conns.store).all()
