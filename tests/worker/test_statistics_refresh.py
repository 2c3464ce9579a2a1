"""The sweeper's statistics refresh retries a failing call after a growing pause, not
every tick (a worker role without the function's grant would otherwise log a warning a
second, forever). Against the database: tests/store/test_settlement_plans.py."""

from __future__ import annotations

from typing import Any

import pytest

from runfleet.store.sweeps import Analyzed
from runfleet.worker.statistics import StatisticsRefresh


class _Sweeps:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = True

    async def analyze_grown(self) -> list[Analyzed]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("permission denied for function analyze_grown")
        return [Analyzed("runs", 0, 40)]


class _Store:
    def __init__(self) -> None:
        self.sweeps = _Sweeps()


async def test_a_failing_refresh_pauses_and_doubles_its_pause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="runfleet.worker.statistics")
    now = [1000.0]
    store: Any = _Store()
    refresh = StatisticsRefresh(store, clock=lambda: now[0])
    await refresh.tick()
    await refresh.tick()  # within the pause: not called
    assert store.sweeps.calls == 1
    now[0] += 2.1  # the first pause is 2 s
    await refresh.tick()
    assert store.sweeps.calls == 2
    now[0] += 2.1  # the second is 4 s
    await refresh.tick()
    assert store.sweeps.calls == 2
    now[0] += 2.0
    store.sweeps.fail = False
    await refresh.tick()
    assert store.sweeps.calls == 3
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == [
        "statistics.refreshed"
    ]
    await refresh.tick()  # a success clears the pause: every tick again
    assert store.sweeps.calls == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["statistics.refresh_failed"] * 2  # one per failed call, not per tick
