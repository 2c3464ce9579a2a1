"""``runfleet schedule ...`` with the real CLI against real services; the scheduler pass
in-process (``Scheduler.tick``) shows what pause, resume and remove do to admissions."""

from __future__ import annotations

import asyncio
import json

from runfleet.broker.client import connect
from runfleet.broker.streams import Streams
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.schedules import Schedules
from runfleet.worker.scheduler import Scheduler
from tests.ops.conftest import Cli
from tests.schedules.helpers import tick_runs


async def test_add_list_pause_resume_remove(cli: Cli, store: Store, settings: Settings) -> None:
    unknown = await cli("schedule", "add", "nightly", "--flow", "sched.noop", "--cron", "@daily")
    assert unknown.clean and unknown.code == 1 and "unknown flow 'sched.noop'" in unknown.stderr
    added = await cli(
        "schedule", "add", "nightly", "--flow", "sched.noop", "--cron", "* * * * * *",
        "--timezone", "Europe/Paris", "--catch-up", "2", "--overlap", "skip", "--json",
        "--late-binding",  # no worker has registered sched.noop in this test
    )  # fmt: skip
    assert added.code == 0, added
    shown = json.loads(added.stdout)
    assert shown["timezone"] == "Europe/Paris" and shown["catch_up"] == 2
    assert shown["overlap"] == "skip" and shown["origin"] == "cli" and not shown["paused"]
    again = await cli(
        "schedule", "add", "nightly", "--flow", "f", "--cron", "@daily", "--late-binding"
    )
    assert again.clean and again.code == 1 and "already exists" in again.stderr

    redis = connect(settings)
    scheduler = Scheduler(store, settings, Streams(redis, settings.redis_prefix))
    try:
        await asyncio.sleep(1.1)
        assert await scheduler.tick() == 1  # admitted, and woken on the queue's stream
        assert await redis.xlen(f"{settings.redis_prefix}:q:default") == 1

        paused = await cli("schedule", "pause", "nightly")
        assert paused.code == 0 and "paused" in paused.stdout
        await asyncio.sleep(2.2)
        assert await scheduler.tick() == 0  # due, but paused
        listed = json.loads((await cli("schedule", "list", "--json")).stdout)
        assert [s["name"] for s in listed["schedules"]] == ["nightly"]
        assert listed["schedules"][0]["paused"] and listed["schedules"][0]["admitted"] == 1

        resumed = await cli("schedule", "resume", "nightly", "--json")
        assert resumed.code == 0 and not json.loads(resumed.stdout)["paused"]
        row = await Schedules.of(store).get("nightly")
        # the resume moved the next tick past its own write (a per-second cron: the read
        # itself may come after that tick), and counted nothing as missed
        assert row is not None and row.next_tick_ms > row.updated_at_ms and row.missed == 0

        plain = await cli("schedule", "list")
        assert (
            plain.code == 0 and "nightly: * * * * * * (Europe/Paris) -> sched.noop" in plain.stdout
        )

        removed = await cli("schedule", "remove", "nightly")
        assert removed.code == 0 and "removed schedule nightly" in removed.stdout
        await asyncio.sleep(1.1)
        assert await scheduler.tick() == 0
        assert len(await tick_runs(settings.database_url, "nightly")) == 1
    finally:
        await redis.aclose()
    for verb in ("pause", "resume", "remove"):
        missing = await cli("schedule", verb, "nightly")
        assert missing.clean and missing.code == 1
        assert missing.stderr.strip() == "error: no schedule named 'nightly'"


async def test_bad_cron_and_bad_timezone_are_one_line(cli: Cli) -> None:
    for argv, message in (
        (("--cron", "61 * * * *"), "invalid schedule: '61 * * * *' is not a cron expression"),
        (("--cron", "* * *"), "invalid schedule: '* * *' has 3 field(s)"),
        (
            ("--cron", "* * * * *", "--timezone", "Europe/Pariss"),
            "invalid timezone: 'Europe/Pariss'",
        ),
        (("--cron", "* * * * *", "--overlap", "sometimes"), "invalid overlap: 'sometimes'"),
        (("--cron", "* * * * *", "--payload", "{bad"), "--payload is not valid JSON"),
    ):
        refused = await cli("schedule", "add", "x", "--flow", "sched.noop", *argv)
        assert refused.clean and refused.code == 1, refused
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert message in refused.stderr, refused.stderr
    listed = await cli("schedule", "list")
    assert listed.code == 0 and "no schedules" in listed.stdout
