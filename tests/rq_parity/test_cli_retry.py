"""``runfleet retry RUN``: a failed run runs again as the next round, read through its id."""

from __future__ import annotations

import json
from pathlib import Path

from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.ops.conftest import cli_env, invoke
from tests.rq_parity import jobs
from tests.support.polling import until


async def test_retry_a_failed_run_from_the_cli(
    settings: Settings, worker: Worker, queue: AsyncQueue, tmp_path: Path
) -> None:
    marker = tmp_path / "fixed"
    run = await queue.enqueue(jobs.fail_unless_exists, str(marker), job_id="cli-retry")
    await until(run.get_status, 20, "the run to fail", accept=lambda s: s is RunStatus.FAILED)
    env = cli_env(settings)
    not_yet = await invoke(env, "retry", "cli-retry", "--json")
    assert not_yet.code == 0, not_yet.stderr
    first = json.loads(not_yet.stdout)
    assert first["run_id"] == "cli-retry" and first["retry_id"] == "cli-retry@1"
    # Still failing (the marker is missing): the round fails; a retry makes round 2.
    again = queue.run("cli-retry@1")
    await until(again.get_status, 20, "round 2 to fail", accept=lambda s: s is RunStatus.FAILED)
    marker.write_text("")
    fixed = await invoke(env, "retry", "cli-retry")
    assert fixed.code == 0, fixed.stderr
    assert "retried as cli-retry@2" in fixed.stdout
    assert await queue.run("cli-retry@2").result(20) == "ok"
    assert await queue.run("cli-retry").get_status() is RunStatus.FAILED  # terminal stays
    done = await invoke(env, "retry", "cli-retry")
    assert done.code == 1 and "completed, not failed" in done.stderr
    missing = await invoke(env, "retry", "no-such-run")
    assert missing.code == 1 and "no run with id 'no-such-run'" in missing.stderr
