"""Reading runs: ``runs``, ``show``, ``journal``, ``tree`` and ``explain``.

Every command reads Postgres (the truth); ``explain`` also asks Redis who is alive,
and still answers — saying so — when Redis does not.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from runfleet.ops.cli import common as c
from runfleet.ops.cli import text as t
from runfleet.ops.cli.options import LIST_MAX, Since, since_option
from runfleet.ops.explain.report import entry, explain, gather
from runfleet.ops.models import (
    ClockView,
    DeferredView,
    Explanation,
    JournalEntry,
    JournalView,
    OwnerView,
    RunDetail,
    RunList,
    RunSummary,
    TreeNode,
    TreeView,
    WaitingTreeRow,
)
from runfleet.store.config import Settings
from runfleet.store.types import OnParentExit, RunRow, RunStatus

RunId = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]
MAX_TREE_DEPTH = 16
FOLLOW_POLL_S = 0.5
STATUS_STYLE = {
    RunStatus.PENDING: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.SUSPENDED: "magenta",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.CANCELLED: "dim",
}


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("show")(show)
    app.command("journal")(journal)
    app.command("tree")(tree)
    app.command("explain")(explain_cmd)


def _status(status: RunStatus) -> Text:
    return t.styled(status.value, STATUS_STYLE[status])


def _where(run: RunSummary) -> str:
    if run.owner is not None:
        return f"{run.owner.host} pid {run.owner.pid}"
    if run.waiting is not None:
        return f"waits: {run.waiting.reason}"
    return ""


# ---- runs ------------------------------------------------------------------------


def runs(
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this status.")] = None,
    flow: Annotated[str | None, typer.Option(help="Only runs of this flow.")] = None,
    queue: Annotated[str | None, typer.Option(help="Only runs on this queue.")] = None,
    since: Annotated[
        Since | None,
        typer.Option(
            parser=since_option, help="Admitted since: a duration back (15m, 2h) or ISO time."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=LIST_MAX, help="At most this many.")] = 50,
    as_json: c.AsJson = False,
    wide: c.Wide = False,
) -> None:
    """List runs, newest first (ids whole: on a narrow terminal other cells fold)."""
    listing = c.run(_runs(c.settings(), status, flow, queue, since, limit))
    if as_json:
        c.emit(listing)
        return
    table = t.table("id", "flow", "queue", "status", "age", "where", ids=("id",))
    for run in listing.runs:
        age = c.seconds(listing.now_ms - run.created_at_ms)
        t.add_row(table, run.id, run.flow, run.queue, _status(run.status), age, _where(run))
    t.show(table, wide=wide)
    t.say(t.styled(f"{len(listing.runs)} run(s)", "dim"))


async def _runs(
    cfg: Settings,
    status: RunStatus | None,
    flow: str | None,
    queue: str | None,
    since: Since | None,
    limit: int,
) -> RunList:
    async with c.connect(cfg, read=True) as conns:
        return await list_view(conns, status, flow, queue, since, limit)


async def list_view(
    conns: c.Connections,
    status: RunStatus | None,
    flow: str | None,
    queue: str | None,
    since: Since | None,
    limit: int,
) -> RunList:
    """``runs --json`` over open connections (the dashboard's ``/runs`` reads the same)."""
    now = await conns.store.stats.now_ms()
    since_ms = since.bound_ms(now) if since else None
    rows = await conns.store.inspect.list_runs(
        status=status, flow=flow, queue=queue, since_ms=since_ms, limit=limit
    )
    return RunList(now_ms=now, runs=[RunSummary.of(r) for r in rows])


# ---- show ------------------------------------------------------------------------


def show(run_id: RunId, as_json: c.AsJson = False) -> None:
    """Everything the database holds about one run."""
    detail = c.run(_show(c.settings(), run_id))
    if as_json:
        c.emit(detail)
        return
    run = detail.run
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")

    def add(name: str, value: t.Part) -> None:
        t.add_row(table, name, value)

    add("id", run.id)
    add("flow / queue", f"{run.flow} / {run.queue}")
    add("status", _status(run.status))
    add("created", c.stamp(run.created_at_ms))
    add("updated", c.stamp(run.updated_at_ms))
    add("epoch", str(run.epoch))
    if run.owner:
        hb = run.heartbeat_at_ms or 0
        add("owner", f"{run.owner.key} (lease {c.seconds(detail.now_ms - hb)} old)")
    if detail.claim:
        add("claim", f"{detail.claim.key} since {c.stamp(detail.claimed_at_ms)}")
    if run.waiting:
        add("waiting", json.dumps(run.waiting.model_dump(exclude_none=True), default=str))
    if run.cancel_requested_at_ms:
        add("cancel requested", c.stamp(run.cancel_requested_at_ms))
    add("lineage / round", f"{run.lineage_id} / {run.round_ordinal}")
    if run.parent_run_id:
        add("previous round", run.parent_run_id)
    add("parents", ", ".join(detail.parents) or "-")
    add("children", ", ".join(detail.children) or "-")
    for clock in detail.pending_clocks:
        add("timer", f"{clock.name} due {c.stamp(clock.due_at_ms)}")
    for d in detail.deferreds:
        add("completion", f"{d.name} at {c.stamp(d.completed_at_ms)}")
    add("state", t.block(json.dumps(detail.state, indent=2, default=str)))
    t.show(table)


async def _show(cfg: Settings, run_id: str) -> RunDetail:
    async with c.connect(cfg, read=True) as conns:
        return await detail_view(conns, run_id)


async def detail_view(conns: c.Connections, run_id: str) -> RunDetail:
    """``show --json`` over open connections."""
    row = await conns.run_row(run_id)
    store = conns.store
    deferred = await store.inspect.waiting_deferred(run_id) if row.waiting else None
    return RunDetail(
        run=RunSummary.of(row, deferred),
        now_ms=row.now_ms,
        claim=OwnerView.of(row.claim),
        claimed_at_ms=row.claimed_at_ms,
        state=row.state,
        parents=[e.parent_id for e in await store.dag.parents(run_id)],
        children=[e.child_id for e in await store.dag.children(run_id)],
        pending_clocks=[
            ClockView(name=k.name, due_at_ms=k.due_at_ms)
            for k in await store.waits.pending_clocks(run_id)
        ],
        deferreds=[
            DeferredView(
                name=d.name,
                completed_at_ms=d.completed_at_ms,
                consumed_at_ms=d.consumed_at_ms,
                value=d.value,
            )
            for d in await store.deferreds.completed_deferreds(run_id)
        ],
    )


# ---- journal ---------------------------------------------------------------------


def journal(
    run_id: RunId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new records until it settles.")
    ] = False,
    as_json: c.AsJson = False,
) -> None:
    """A run's journal, oldest first, each decision in plain words.

    With ``--follow --json`` each record is one JSON line (a ``JournalEntry``).
    """
    c.run(_journal(c.settings(), run_id, follow, as_json))


async def _journal(cfg: Settings, run_id: str, follow: bool, as_json: bool) -> None:
    streaming = as_json and follow
    collected: list[JournalEntry] = []
    async with c.connect(cfg, read=True) as conns:
        await conns.run_row(run_id)
        after = 0
        while True:
            batch = await conns.store.journal.records(run_id, after_seq=after, limit=1000)
            for record in batch:
                item = entry(record)
                if streaming:
                    c.emit(item, indent=None)
                elif as_json:
                    collected.append(item)
                else:
                    when = c.clock(record.at_ms)
                    t.say(f"{when}  ", t.styled(record.kind, "bold"), f"  {item.sentence}")
            if batch:
                after = batch[-1].seq
                continue
            if not follow:
                break
            # A record and the status change it describes commit together, so one more
            # read after seeing a terminal status catches everything up to it.
            if (await conns.run_row(run_id)).status.terminal:
                follow = False
                continue
            await asyncio.sleep(FOLLOW_POLL_S)
    if as_json and not streaming:
        c.emit(JournalView(run_id=run_id, entries=collected))


# ---- tree ------------------------------------------------------------------------


def tree(run_id: RunId, as_json: c.AsJson = False) -> None:
    """Children (attached and detached), handoff rounds, and what the run really waits on."""
    view = c.run(_tree(c.settings(), run_id))
    if as_json:
        c.emit(view)
        return
    root = t.tree(*_label(view.run))
    _grow(root, view.children)
    t.show(root)
    if len(view.rounds) > 1:
        t.say(f"rounds of lineage {view.run.lineage_id}:")
        for r in view.rounds:
            mark = "  <- this run" if r.id == view.run.id else ""
            t.say(f"  round {r.round_ordinal}: {r.id} ", _status(r.status), mark)
    if view.waiting:
        t.say("waiting on:")
        for w in view.waiting:
            due = f" due {c.clock(w.wake_at_ms)}" if w.wake_at_ms else ""
            token = f" token {w.token}" if w.token else ""
            t.say(f"  {'  ' * w.depth}{w.run_id}: {w.reason}{due}{token}")


def _label(run: RunSummary, attached: bool = True, truncated: bool = False) -> list[t.Part]:
    label: list[t.Part] = [run.id, " ", t.styled(run.flow, "dim"), " ", _status(run.status)]
    if not attached:
        label += [" ", t.styled("(detached)", "dim")]
    return label + ([" …"] if truncated else [])


def _grow(parent: Tree, nodes: list[TreeNode]) -> None:
    for node in nodes:
        _grow(t.branch(parent, *_label(node.run, node.attached, node.truncated)), node.children)


async def _tree(cfg: Settings, run_id: str) -> TreeView:
    async with c.connect(cfg, read=True) as conns:
        return await tree_view(conns, run_id)


async def tree_view(conns: c.Connections, run_id: str) -> TreeView:
    """``tree --json`` over open connections."""
    row = await conns.run_row(run_id)
    children = await _children(conns, row, 1, {row.id})
    rounds = await conns.store.inspect.lineage(row.lineage_id)
    waiting = await conns.store.waits.waiting_tree(run_id)
    return TreeView(
        run=RunSummary.of(row),
        children=children,
        rounds=[RunSummary.of(r) for r in rounds],
        waiting=[WaitingTreeRow.of(w) for w in waiting],
    )


async def _children(
    conns: c.Connections, row: RunRow, depth: int, seen: set[str]
) -> list[TreeNode]:
    """The DAG below ``row``; a run reached twice (a diamond) is shown once, then marked."""
    edges = await conns.store.dag.children(row.id)
    rows = {r.id: r for r in await conns.store.runs.get_many([e.child_id for e in edges])}
    nodes: list[TreeNode] = []
    for e in edges:
        child = rows.get(e.child_id)
        if child is None:
            continue
        again = child.id in seen
        seen.add(child.id)
        walk = not again and depth < MAX_TREE_DEPTH
        nodes.append(
            TreeNode(
                run=RunSummary.of(child),
                attached=child.on_parent_exit is OnParentExit.CANCEL,
                children=await _children(conns, child, depth + 1, seen) if walk else [],
                truncated=not walk,
            )
        )
    return nodes


# ---- explain ---------------------------------------------------------------------


def explain_cmd(run_id: RunId, as_json: c.AsJson = False) -> None:
    """Why a run is where it is, and what will happen next, in plain words."""
    result = c.run(_explain(c.settings(), run_id))
    if as_json:
        c.emit(result)
        return
    for line in result.lines:
        t.say(line)


async def _explain(cfg: Settings, run_id: str) -> Explanation:
    async with c.connect(cfg, redis="optional", read=True) as conns:
        return explain(await gather(conns, run_id))
