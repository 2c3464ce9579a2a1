"""The fleet as a whole: ``fleet`` (who is alive) and ``stuck`` (what needs a person).

``fleet`` reads the liveness keys workers refresh every heartbeat, so it lists
exactly the processes a thief's probe would consider alive; the database adds how
many runs each really owns. ``stuck`` lists only what the fleet will not fix by
itself: the sweeps recover dead owners and lost wakes without anyone's help.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runfleet.broker.liveness import FleetMember, Liveness, Probe
from runfleet.ops.cli import common as c
from runfleet.ops.cli.options import LIST_MAX, RESTARTS_MAX, duration_option
from runfleet.ops.cli.text import add_row, say, show, styled
from runfleet.ops.cli.text import table as table_of
from runfleet.ops.explain.predict import dead_words
from runfleet.ops.models import (
    FleetMemberView,
    FleetView,
    KeyLimitView,
    QueueLimitView,
    RunSummary,
    StuckItem,
    StuckKind,
    StuckView,
)
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.inspect import DEFAULT_REACTIVATED_OVER
from runfleet.store.queues import key_label
from runfleet.store.types import Owner, RunRow, WaitingReason
from runfleet.worker.carried import can_run


def register(app: typer.Typer) -> None:
    app.command("fleet")(fleet)
    app.command("stuck")(stuck)


# ---- fleet -----------------------------------------------------------------------


def fleet(
    host: Annotated[str | None, typer.Option(help="Only workers on this host id.")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Exit 1 unless a live worker is listed: unlapsed, its key not suspect "
            "(a healthcheck).",
        ),
    ] = False,
    as_json: c.AsJson = False,
    wide: c.Wide = False,
) -> None:
    """Live worker processes (from their liveness keys) and the runs each owns.

    A key no live worker would write (no TTL, a TTL no worker sets, a confirmed time
    in the future or older than ``stale_after`` while unlapsed: a forged or leftover
    key) is listed as SUSPECT and does not satisfy ``--check``.
    """
    view = c.run(_fleet(c.settings(), host, with_db=not check))
    if check and not any(not w.lapsed and w.suspect is None for w in view.workers):
        c.fail(f"no live worker{' on host ' + host if host else ''}")
    if as_json:
        c.emit(view)
        return
    table = table_of("host", "pid", "up", "lease confirmed", "runs", "lapsed", "queues")
    for w in view.workers:
        runs = "?" if w.runs_owned is None else str(w.runs_owned)
        suspect = w.suspect is not None
        add_row(
            table,
            w.host,
            str(w.pid),
            c.seconds(w.age_ms) if w.age_ms is not None and not suspect else "?",
            "?" if suspect else f"{c.seconds(w.confirmed_age_ms)} ago",
            runs,
            styled("LAPSED", "red") if w.lapsed else "no",
            ",".join(w.queues),
        )
    show(table, wide=wide)
    for w in view.workers:
        if w.suspect is not None:
            say(
                styled("SUSPECT", "red"),
                f" {w.host} pid {w.pid} (nonce {w.nonce}): "
                f"{w.suspect}; not a live worker (forged or left over?)",
            )
    for q in view.queues:
        limit = (
            "unlimited" if q.concurrency is None else f"{q.running}/{q.concurrency} slots in use"
        )
        rate = "" if q.rate_per_s is None else f", rate {q.rate_per_s:g}/s"
        keyed = ""
        if q.keyed:
            per = "" if q.key_concurrency is None else f", {q.key_concurrency} per key"
            per += "" if q.key_rate_per_s is None else f", {q.key_rate_per_s:g}/s per key"
            keyed = f", keyed (round-robin{per})"
        say(f"queue {q.name}: {limit}{rate}{keyed}, default priority {q.default_priority}")
        for k in q.keys:
            token = "" if not k.next_token_ms else f", next token in {k.next_token_ms} ms"
            say(f"  key {key_label(k.key)}: {k.running} running, {k.waiting} waiting{token}")
    suspects = sum(w.suspect is not None for w in view.workers)
    also = f", {suspects} suspect" if suspects else ""
    say(styled(f"{len(view.workers)} worker process(es){also}", "dim"))


async def _fleet(cfg: Settings, host: str | None, *, with_db: bool) -> FleetView:
    """Redis is required (the keys are the answer); the database only adds counts."""
    owned: dict[Owner, int] | None = None
    limits: list[QueueLimitView] = []
    now = c.wall_ms()  # without the database (a healthcheck), this host's clock judges
    if with_db:
        try:
            async with c.connect(cfg, read=True) as conns:
                owned = await conns.store.stats.running_by_owner()
                now = await conns.store.stats.now_ms()
                limits = await queue_limits(conns.store)
        except Exception as exc:  # the keys still answer the question; say what is missing
            c.warn(f"no run counts: {exc}")
    redis = c.redis_client(cfg)
    try:
        members = await Liveness.for_settings(redis, cfg).fleet(now)
    finally:
        await redis.aclose()
    view = fleet_view(members, owned, now, host)
    return view.model_copy(update={"queues": limits})


async def queue_limits(store: Store) -> list[QueueLimitView]:
    """Every configured queue's limit and its slots in use (two reads)."""
    queues = await store.queues.all()
    running = await store.queues.running([q.name for q in queues])
    views = []
    for q in queues:
        keys = await store.queues.keys(q.name, limit=KEYS_SHOWN) if q.keyed else []
        views.append(
            QueueLimitView(
                name=q.name,
                concurrency=q.concurrency,
                running=running[q.name],
                default_priority=q.default_priority,
                rate_per_s=q.rate_per_s,
                keyed=q.keyed,
                key_concurrency=q.key_concurrency,
                key_rate_per_s=q.key_rate_per_s,
                keys=[
                    KeyLimitView(
                        key=k.key, running=k.running, waiting=k.waiting, next_token_ms=k.wait_ms
                    )
                    for k in keys
                ],
            )
        )
    return views


KEYS_SHOWN = 5
"""Keys of a keyed queue ``runfleet fleet`` lists (its next turns)."""


def fleet_view(
    members: list[FleetMember], owned: dict[Owner, int] | None, now: int, host: str | None = None
) -> FleetView:
    """``fleet --json`` from the liveness keys and the database's counts (the dashboard's too)."""
    members = [m for m in members if host is None or m.host == host]
    return FleetView(now_ms=now, workers=[_member(m, owned, now) for m in members])


def _member(m: FleetMember, owned: dict[Owner, int] | None, now: int) -> FleetMemberView:
    return FleetMemberView(
        host=m.host,
        pid=m.pid,
        nonce=m.nonce,
        started_ms=m.started_ms,
        age_ms=c.wall_ms() - m.started_ms if m.started_ms is not None else None,
        confirmed_ms=m.confirmed_ms,
        confirmed_age_ms=max(0, now - m.confirmed_ms),
        lapsed=m.lapsed,
        queues=list(m.queues),
        runs_owned=owned.get(m.owner, 0) if owned is not None else None,
        runs_reported=m.runs,
        ttl_ms=m.ttl_ms,
        suspect=m.suspect,
    )


# ---- stuck -----------------------------------------------------------------------


def stuck(
    pending_for: Annotated[
        int,
        typer.Option(
            parser=duration_option,
            show_default="60s",
            help="Report pending runs not started after this long (90s, 5m).",
        ),
    ] = 60_000,
    overdue: Annotated[
        int,
        typer.Option(
            parser=duration_option,
            show_default="5s",
            help="Report timed waits not woken this long after their due time.",
        ),
    ] = 5_000,
    reactivated_over: Annotated[
        int,
        typer.Option(
            min=0,
            max=RESTARTS_MAX,
            help="Report unsettled runs restarted (taken over or released) more than this "
            "many times.",
        ),
    ] = DEFAULT_REACTIVATED_OVER,
    limit: Annotated[
        int, typer.Option(min=1, max=LIST_MAX, help="At most this many per kind.")
    ] = 200,
    as_json: c.AsJson = False,
    wide: c.Wide = False,
) -> None:
    """Runs that need a person: live owners not renewing, runs restarted again and again,
    unfired timers, quarantine, …"""
    view = c.run(_stuck(c.settings(), pending_for, overdue, reactivated_over, limit))
    if as_json:
        c.emit(view)
        return
    if not view.items:
        say("nothing stuck: the sweeps handle everything else.")
        return
    table = table_of("kind", "run", "flow / queue", "for", "what", "do", ids=("run",))
    for item in view.items:
        add_row(
            table,
            item.kind,
            item.run.id,
            f"{item.run.flow} / {item.run.queue}",
            c.seconds(item.age_ms),
            item.detail,
            item.action,
        )
    show(table, wide=wide)


async def _stuck(
    cfg: Settings, pending_ms: int, overdue_ms: int, reactivated_over: int, limit: int
) -> StuckView:
    async with c.connect(cfg, redis="optional") as conns:
        if conns.redis_error:
            c.warn(
                f"Redis did not answer ({conns.redis_error}): "
                "live owners cannot be told from dead ones"
            )
        live = conns.liveness if conns.redis is not None else None
        store = conns.store
        items = await _stale(cfg, store, live, limit)
        for row in await store.inspect.waiting_for(WaitingReason.DEAD, limit=limit):
            items.append(
                _item(
                    "dead",
                    row,
                    row.now_ms - row.updated_at_ms,
                    dead_words(row, row.waiting.request if row.waiting else None),
                    f"find why in the workers' logs (exit codes, OOM kills, segfaults; run_id "
                    f"{row.id}), fix it, then `runfleet resume {row.id}` (or cancel it); "
                    f"`runfleet explain {row.id}` has the evidence",
                )
            )
        for looping in await store.inspect.reactivated_over(reactivated_over, limit=limit):
            row = looping.row
            items.append(
                _item(
                    "reactivated-often",
                    row,
                    row.now_ms - row.created_at_ms,
                    f"its body was restarted {looping.restarts} times (takeovers: "
                    f"{looping.takeovers}, releases: {looping.restarts - looping.takeovers}; "
                    f"epoch {row.epoch}), the last at {c.clock(looping.last_at_ms)}",
                    "it probably fails the same way every time: look for run.drive_failed "
                    f"or lease.lapsed in the workers' logs with run_id {row.id}, then cancel "
                    "it or fix and redeploy",
                )
            )
        for row in await store.inspect.overdue_waits(overdue_ms, limit=limit):
            due = row.waiting.wake_at_ms if row.waiting and row.waiting.wake_at_ms else 0
            items.append(
                _item(
                    "timer-not-fired",
                    row,
                    row.now_ms - due,
                    f"{row.waiting.reason if row.waiting else 'timer'} due {c.clock(due)} "
                    "was not woken",
                    "check that workers run (their sweeps fire timers) and their logs for "
                    "sweep.failed",
                )
            )
        for row in await store.inspect.waiting_for(WaitingReason.QUARANTINE, limit=limit):
            items.append(
                _item(
                    "quarantined",
                    row,
                    row.now_ms - row.updated_at_ms,
                    "a recorded step output failed its digest or decoding",
                    f"inspect with `runfleet explain {row.id}`, then resume it (accept the "
                    "recorded output or re-run the step)",
                )
            )
        if live is not None:
            items += await _unrunnable(store, live, min(pending_ms, cfg.stale_after_ms), limit)
        for row in await store.inspect.pending_older(pending_ms, limit=limit):
            items.append(
                _item(
                    "pending-too-long",
                    row,
                    row.now_ms - row.created_at_ms,
                    "admitted but never started",
                    f"check `runfleet fleet` for workers on queue {row.queue} that know flow "
                    f"{row.flow}, and the stream lag (`runfleet doctor`)",
                )
            )
        now = await store.stats.now_ms()
    # A run can fit two kinds (a delayed admission never started is also an unfired
    # timer); the first, more specific, kind wins.
    unique = {i.run.id: i for i in reversed(items)}
    return StuckView(now_ms=now, items=[i for i in items if unique[i.run.id] is i])


async def _unrunnable(store: Store, live: Liveness, older_ms: int, limit: int) -> list[StuckItem]:
    """Pending runs that live workers serve the queue of, none of which may run the flow
    (by what each advertised: ``worker.carried``). Reported after ``stale_after``, not
    ``--pending-for``: waiting will not help them. A queue no live worker serves is left
    to ``pending-too-long``, and a worker that advertised nothing is given the benefit."""
    members = [m for m in await live.fleet(await store.stats.now_ms()) if m.live]
    if not members:
        return []
    items: list[StuckItem] = []
    for row in await store.inspect.pending_older(older_ms, limit=limit):
        serving = [m for m in members if row.queue in m.queues]
        if not serving or any(can_run(m.info, row.flow) is not False for m in serving):
            continue
        module = row.flow.partition(":")[0] if ":" in row.flow else None
        if module is not None:
            why = f"no function of module {module} may be imported"
            fix = f"--allow-import {module} (or --flows {module})"
        else:
            why = f"flow {row.flow} is not registered"
            fix = "--flows naming the module that registers it"
        items.append(
            _item(
                "no-worker-can-run",
                row,
                row.now_ms - row.created_at_ms,
                f"{len(serving)} live worker(s) serve queue {row.queue}, and by each: {why}",
                f"start a worker with --queues {row.queue} {fix}; or cancel it "
                f"(`runfleet cancel {row.id}`)",
            )
        )
    return items


async def _stale(cfg: Settings, store: Store, live: Liveness | None, limit: int) -> list[StuckItem]:
    """Stale leases a takeover will not resolve: the owner is vouched for, or nobody acts."""
    probes: dict[tuple[Owner, int], Probe] = {}
    items: list[StuckItem] = []
    overdue_ms = cfg.stale_after_ms + cfg.takeover_overdue_ms  # the line `explain` draws
    for row in await store.sweeps.stale_running(cfg.stale_after_ms, limit):
        assert row.owner is not None and row.heartbeat_at_ms is not None
        age = row.now_ms - row.heartbeat_at_ms
        probe = None
        if live is not None:
            lease = (row.owner, row.heartbeat_at_ms)
            if lease not in probes:
                probes[lease] = await live.probe(row.owner, row.heartbeat_at_ms)
            probe = probes[lease]
        if probe is not None and probe.vouches:
            items.append(
                _item(
                    "stale-owner-alive",
                    row,
                    age,
                    f"{c.who(row.owner)} is alive ({probe.evidence}) but has not renewed its "
                    f"lease for {c.seconds(age)}; takeovers are refused",
                    f"look at {c.who(row.owner)}: stopped (SIGSTOP)? a blocked event loop? cut "
                    "off from the database? Restarting it releases the run",
                )
            )
        elif age > overdue_ms:
            seen = probe.evidence if probe else "no probe answered"
            items.append(
                _item(
                    "takeover-overdue",
                    row,
                    age,
                    f"lease stale for {c.seconds(age)} and {c.who(row.owner)} not vouched for "
                    f"({seen}), yet nobody took it over",
                    f"start workers on queue {row.queue} that know flow {row.flow}",
                )
            )
    return items


def _item(kind: StuckKind, row: RunRow, age_ms: int, detail: str, action: str) -> StuckItem:
    return StuckItem(
        kind=kind, run=RunSummary.of(row), age_ms=max(0, age_ms), detail=detail, action=action
    )
