"""``runfleet bench capacity`` at a tiny size: the counts it prints are the servers' own.

The figures in the README's "Capacity on paper" come from this command; a counter read
wrongly (another database's statements, the bench's own INFO calls) would show here as a
run or a step costing nothing, or more than its unbatched two write transactions (claim
and settle; attempt and record).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from tests.fleet.procs import ROOT


async def test_capacity_counts_at_most_two_writes_per_run_and_per_step() -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "runfleet.ops.bench", "capacity", "-n", "60", "-k", "8", "--idle", "2",
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    zero, step = result["per_run_zero_steps"], result["per_step"]
    # Claims, settlements and step writes are batched across runs: at most the one-run
    # costs (2 write transactions per run, 2 per step), fewer the more runs share a batch;
    # never zero (a counter reading nothing), never more (another database's statements).
    assert 0 < zero["write_transactions"] <= 2.2, result
    assert 0 < step["write_transactions"] <= 2.2, result
    assert 0 < step["statements"] <= 2.3, result
    assert zero["redis_by_command"]["xadd"] == pytest.approx(1.0, abs=0.1), result
    assert zero["postgres_cpu_ms"] > 0 and zero["wal_bytes"] > 0, result
    assert 2 <= result["postgres_connections_per_process"] <= 10, result
