"""``runfleet worker --processes N``: a supervisor restarts crashed children, stops on signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.store.config import Settings
from tests.fleet.procs import ROOT, settings_env
from tests.support.polling import until

pytestmark = pytest.mark.chaos


async def test_crashed_child_is_restarted_with_a_new_identity(settings: Settings) -> None:
    supervisor = _supervise(settings)
    redis = connect(settings)
    liveness = Liveness(redis, settings.redis_prefix, settings.host_id)

    async def members(n: int) -> list[int] | None:
        pids = sorted(m.pid for m in await liveness.fleet())
        return pids if len(pids) == n else None

    try:
        first = await until(lambda: members(2), 30, "two supervised children")
        os.kill(first[0], signal.SIGKILL)

        async def replaced() -> list[int] | None:
            pids = await members(2)
            return pids if pids and first[0] not in pids else None

        second = await until(replaced, 30, "the killed child to be replaced")
        assert first[1] in second  # the other child was left alone
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
        await until(lambda: _none_left(liveness), 5, "every child to stop")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        await redis.aclose()


async def test_children_that_all_die_at_once_are_all_restarted(settings: Settings) -> None:
    """Every child fail-stopping on the same partition must not end the supervisor."""
    supervisor = _supervise(settings)
    redis = connect(settings)
    liveness = Liveness(redis, settings.redis_prefix, settings.host_id)

    async def members(n: int) -> list[int] | None:
        pids = sorted(m.pid for m in await liveness.fleet())
        return pids if len(pids) == n else None

    try:
        first = await until(lambda: members(2), 30, "two supervised children")
        for pid in first:
            os.kill(pid, signal.SIGKILL)

        async def replaced() -> list[int] | None:
            pids = await members(2)
            return pids if pids and not set(first) & set(pids) else None

        await until(replaced, 30, "both children to be replaced")
        assert supervisor.poll() is None
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        await redis.aclose()


async def test_children_stop_when_their_supervisor_is_sigkilled(settings: Settings) -> None:
    """Nothing forwards a stop to, or restarts, the children of a dead supervisor: they
    stop by themselves (gracefully: each removes its liveness key) instead of running on
    unsupervised, as they once did for as long as their servers answered."""
    supervisor = _supervise(settings)
    redis = connect(settings)
    liveness = Liveness(redis, settings.redis_prefix, settings.host_id)

    async def members() -> list[int] | None:
        pids = sorted(m.pid for m in await liveness.fleet())
        return pids if len(pids) == 2 else None

    children: list[int] = []
    try:
        children = await until(members, 30, "two supervised children")
        supervisor.kill()
        supervisor.wait(10)

        async def gone() -> bool:
            return not any(_running(pid) for pid in children)

        await until(gone, 20, f"the orphaned children {children} to exit")
        assert await _none_left(liveness)  # a graceful stop: each removed its key
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        for pid in children:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        await redis.aclose()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _supervise(settings: Settings) -> subprocess.Popen[bytes]:
    """``runfleet worker --processes 2`` (a supervisor and two children)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runfleet.ops",
            "worker",
            "--flows",
            "tests.fleet.flows",
            "--processes",
            "2",
            "--concurrency",
            "2",
            "--log-level",
            "WARNING",
        ],
        env=settings_env(settings),
        cwd=ROOT,
    )


async def _none_left(liveness: Liveness) -> bool:
    return not await liveness.fleet()
