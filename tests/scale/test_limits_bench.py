"""``runfleet bench limits`` at a tiny size: the claim statements it counts are real ones
(each setting's runs were claimed), a limit that never binds adds no read beside them, and
a keyed queue's runs are claimed in batches, several a statement (docs/how-to/queues.md "Cost")."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from tests.fleet.procs import ROOT


async def test_limits_bench_counts_the_claims_of_every_setting() -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "runfleet.ops.bench", "limits",
         "-n", "60", "-k", "8", "--rate", "100", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    unlimited, quiet, binding, keyed = json.loads(done.stdout)["settings"]
    for setting in (unlimited, quiet, binding, keyed):
        assert 0 < setting["claim_statements_per_run"] <= 1.5, setting
    assert unlimited["limit_reads_per_run"] == 0, unlimited
    assert quiet["limit_reads_per_run"] <= 0.05, quiet  # no read per claim batch
    # Batched (runfleet.key_pick_many): one statement claims several keyed runs; the
    # one-claim-per-keyed-run path it replaced counted 1.0 or more.
    assert keyed["claim_statements_per_run"] < 0.9, keyed
