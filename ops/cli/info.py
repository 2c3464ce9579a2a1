"""``runfleet info``: every queue at a glance, as ``rq info`` shows it.

Per queue: runs ready, scheduled, running, waiting, parked dead and failed (not yet
requeued), and how many live workers serve it; then the fleet's live workers and
failed total. Postgres says the counts; Redis's liveness keys say who is live, and
without Redis the counts still print (workers ``?``).
"""

from __future__ import annotations

from runfleet.ops.cli import common as c
from runfleet.ops.cli import text as t
from runfleet.ops.models import InfoView, QueueInfoLine
from runfleet.store.config import Settings
from runfleet.store.stats import QueueOverview


def info(as_json: c.AsJson = False, wide: c.Wide = False) -> None:
    """Per queue: pending, scheduled, running, waiting, dead, failed, live workers."""
    view = c.run(_info(c.settings()))
    if as_json:
        c.emit(view)
        return
    table = t.table(
        "queue", "pending", "scheduled", "running", "waiting", "dead", "failed", "workers",
        ids=("queue",),
    )  # fmt: skip
    for q in view.queues:
        t.add_row(
            table,
            q.queue,
            *(str(n) for n in (q.pending, q.scheduled, q.running, q.waiting, q.dead)),
            t.styled(str(q.failed), "red") if q.failed else "0",
            "?" if q.workers is None else str(q.workers),
        )
    if view.queues:
        t.show(table, wide=wide)
    else:
        t.say("no queue holds an open or failed run")
    live = "?" if view.workers is None else str(view.workers)
    t.say(f"{live} live worker(s), {view.failed} failed run(s) not requeued")
    if view.redis_error:
        c.warn(f"Redis did not answer ({view.redis_error}): live workers unknown")


async def _info(cfg: Settings) -> InfoView:
    async with c.connect(cfg, redis="optional", read=True) as conns:
        now = await conns.store.stats.now_ms()
        lines = await conns.store.stats.queue_overview()
        members = await conns.liveness.fleet(now) if conns.redis is not None else None
    live = None if members is None else [m for m in members if m.live]
    served = {name for m in live or () for name in m.queues}
    lines += [QueueOverview(name, 0, 0, 0, 0, 0, 0) for name in served - {q.queue for q in lines}]
    lines.sort(key=lambda q: q.queue)
    queues = [
        QueueInfoLine(
            queue=q.queue,
            pending=q.pending,
            scheduled=q.scheduled,
            running=q.running,
            waiting=q.waiting,
            dead=q.dead,
            failed=q.failed,
            workers=None if live is None else sum(q.queue in m.queues for m in live),
        )
        for q in lines
    ]
    return InfoView(
        now_ms=now,
        queues=queues,
        workers=None if live is None else len(live),
        failed=sum(q.failed for q in lines),
        redis_error=conns.redis_error,
    )
