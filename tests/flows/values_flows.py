"""Flows whose recorded values jsonb would change, and flows producing values nothing can store.

Imported by the in-process worker tests and by real workers (``--flows
tests.flows.values_flows``). Bodies and steps append to a ledger file so a test can
count how many times each really ran, across processes.
"""

from __future__ import annotations

import asyncio
import os
from datetime import date
from typing import Any

from runfleet.store.values import UnstorableValue
from runfleet.worker import Context, Handoff, flow

SPECIALS: list[Any] = [
    1e16,
    -0.0,
    2.0**60,
    1e21,
    5e-324,
    1.7976931348623157e308,
    2**63,
    -(2**70),
    10**30,
]
"""Floats jsonb rewrites as integers or loses the sign of, and ints past 64 bits."""


def specials() -> list[Any]:
    return list(SPECIALS)


def types_of(values: list[Any]) -> list[str]:
    return [type(v).__name__ for v in values]


def ledger(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line + "\n")


@flow(name="t.values.replay_after_park")
async def replay_after_park(ctx: Context) -> dict[str, Any]:
    first = await ctx.step("specials", specials)
    event = await ctx.wait_for("go")
    return {"step": first, "types": types_of(first), "event": event}


@flow(name="t.values.replay_after_kill")
async def replay_after_kill(ctx: Context, marker: str) -> dict[str, Any]:
    first = await ctx.step("specials", specials)
    if not os.path.exists(marker):  # noqa: ASYNC240 - a test flow
        ledger(marker, "held")  # the first execution holds here until it is SIGKILLed
        await asyncio.sleep(60)
    return {"step": first, "types": types_of(first)}


@flow(name="t.values.child")
async def child(ctx: Context) -> list[Any]:
    return specials()


@flow(name="t.values.parent")
async def parent(ctx: Context) -> dict[str, Any]:
    got = await ctx.child(child)
    return {"child": got, "types": types_of(got)}


def _deep(levels: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(levels):
        nested: list[Any] = []
        node.append(nested)
        node = nested
    return root


def unstorable(kind: str, limit: int) -> Any:
    """A value that cannot be recorded, by ``kind``."""
    match kind:
        case "big":
            return "x" * (limit + 1)
        case "nul":
            return {"text": "a\x00b"}
        case "surrogate":
            return ["\ud800"]
        case "deep":
            return _deep(100_000)
        case "nan":
            return {"ratio": float("nan")}
        case _:
            return {"thing": object()}


@flow(name="t.values.unstorable_result")
async def unstorable_result(ctx: Context, kind: str, limit: int, path: str) -> Any:
    ledger(path, f"body {kind}")
    return unstorable(kind, limit)


def _bad_step(kind: str, limit: int, path: str) -> Any:
    ledger(path, f"step {kind}")
    return unstorable(kind, limit)


@flow(name="t.values.unstorable_step")
async def unstorable_step(ctx: Context, kind: str, limit: int, path: str, catch: bool) -> Any:
    ledger(path, f"body {kind}")
    try:
        await ctx.step("bad", _bad_step, kind, limit, path)
    except UnstorableValue as exc:
        if not catch:
            raise
        return {"caught": type(exc).__name__, "field": exc.field, "problem": exc.problem}
    return "stored?"


@flow(name="t.values.raises")
async def raises(ctx: Context) -> None:
    raise ValueError("nul \x00 and a lone \ud800 in the message")


@flow(name="t.values.echo")
async def echo(ctx: Context, value: Any) -> Any:
    return value


@flow(name="t.values.hands_off_badly")
async def hands_off_badly(ctx: Context, how: str) -> Handoff:
    if how == "surrogate":
        return Handoff(echo, ("\ud800",))  # jsonb refuses the lone surrogate in the payload
    return Handoff(echo, ("one", "too many"))  # arguments the next flow does not take


MALFORMED_HANDOFFS: dict[str, tuple[str, Any, Any, Any]] = {
    # how: (the field named, args, kwargs, deadline); each shape is one a type checker
    # would refuse, returned by a body nobody type-checked.
    "args-int": ("args", 5, {}, None),
    "args-none": ("args", None, {}, None),
    "args-str": ("args", "x", {}, None),  # would become the arguments ("x",) by accident
    "kwargs-none": ("kwargs", ("x",), None, None),
    "kwargs-key": ("kwargs", (), {1: "x"}, None),
    "deadline-str": ("deadline", ("x",), {}, "2030-01-01"),
    "deadline-date": ("deadline", ("x",), {}, date(2030, 1, 1)),
}


@flow(name="t.values.hands_off_malformed")
async def hands_off_malformed(ctx: Context, how: str, path: str) -> Handoff:
    ledger(path, ctx.run_id)  # one line per execution of this body
    _field, args, kwargs, deadline = MALFORMED_HANDOFFS[how]
    return Handoff(echo, args, kwargs, deadline)
