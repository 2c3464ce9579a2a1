"""``runfleet prune``: delete settled runs past a retention, and dead stream consumers.

The same walk as the workers' retention loop (``store.retention``), so what an
operator runs by hand and what the fleet does on its own cannot disagree. A dry run
executes the deletion and rolls it back: its counts are exact, not estimated.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import BATCH_MAX, Since, duration_option, since_option
from runfleet.ops.cli.text import say
from runfleet.ops.models import PruneResult
from runfleet.store.config import Settings
from runfleet.store.retention import DEFAULT_BATCH, Retention
from runfleet.worker.retention import DEAD_CONSUMER_IDLE_MS


def register(app: typer.Typer) -> None:
    app.command("prune")(prune)


def prune(
    settled_before: Annotated[
        Since,
        typer.Option(
            "--settled-before",
            parser=since_option,
            help="Delete runs settled longer ago than this (30d, 12h) or before an ISO time.",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    batch: Annotated[
        int, typer.Option(min=1, max=BATCH_MAX, help="Runs per batch (one short transaction).")
    ] = DEFAULT_BATCH,
    queues: Annotated[
        str | None,
        typer.Option(help="Queues whose dead stream consumers to drop (default: all known)."),
    ] = None,
    consumer_idle: Annotated[
        int,
        typer.Option(
            parser=duration_option,
            show_default=f"{DEAD_CONSUMER_IDLE_MS // 60_000}m",
            help="A consumer idle this long with nothing pending is dead.",
        ),
    ] = DEAD_CONSUMER_IDLE_MS,
    as_json: c.AsJson = False,
) -> None:
    """Delete settled runs (journal, steps, waits, edges) in bounded batches.

    A run is kept while any round of its lineage, or any run linked to it as parent
    or child, is still open or settled after the cutoff.
    """
    result = c.run(_prune(c.settings(), settled_before, dry_run, batch, queues, consumer_idle))
    if as_json:
        c.emit(result)
        return
    verb = "would delete" if result.dry_run else "deleted"
    say(
        f"{verb} {result.runs} run(s) settled before {c.stamp(result.settled_before_ms)}: "
        f"journal {result.journal}, steps {result.steps}, attempts {result.attempts}, "
        f"deferreds {result.deferreds}, clocks {result.clocks}, edges {result.run_parents} "
        f"({result.batches} batch(es), {result.scanned} scanned, "
        f"longest batch {result.longest_batch_ms:.0f} ms)"
    )
    if result.keys_pruned is not None:
        say(f"concurrency keys deleted: {result.keys_pruned}")
    if result.consumers_pruned is not None:
        say(f"dead stream consumers deleted: {result.consumers_pruned}")
    elif result.consumers_note:
        say(f"stream consumers: {result.consumers_note}")


async def _prune(
    cfg: Settings,
    settled_before: Since,
    dry_run: bool,
    batch: int,
    queues: str | None,
    idle_ms: int,
) -> PruneResult:
    async with c.connect(cfg, redis="no" if dry_run else "optional") as conns:
        retention = Retention(conns.store.db)
        _, now_ms = await retention.cutoff(0)
        before_ms = settled_before.bound_ms(now_ms)
        done = await retention.prune(before_ms, now_ms, batch=batch, dry_run=dry_run)
        keys = None if dry_run else await retention.prune_keys(batch=batch)
        pruned: int | None = None
        note: str | None = None
        if dry_run:
            note = "not pruned in a dry run"
        elif conns.redis is None:
            note = f"not pruned: Redis unreachable ({conns.redis_error})"
        else:
            names = (
                [q.strip() for q in queues.split(",") if q.strip()]
                if queues is not None
                else await retention.known_queues()
            )
            pruned = await conns.streams.prune_consumers(names, idle_ms)
    deleted = done.deleted
    return PruneResult(
        dry_run=dry_run,
        settled_before_ms=before_ms,
        now_ms=now_ms,
        runs=deleted.runs,
        journal=deleted.journal,
        steps=deleted.steps,
        attempts=deleted.attempts,
        deferreds=deleted.deferreds,
        clocks=deleted.clocks,
        run_parents=deleted.edges,
        scanned=done.scanned,
        batches=done.batches,
        longest_batch_ms=round(done.longest_batch_s * 1000, 3),
        consumers_pruned=pruned,
        consumers_note=note,
        keys_pruned=keys,
    )
