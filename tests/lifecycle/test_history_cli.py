"""``runfleet fork``, ``runfleet resume`` (a failed or cancelled run) and ``runfleet
delete`` against real Postgres, Redis and an in-process worker: what each did, the
journal naming the role that asked, and typed refusals for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import tests.lifecycle.flows as flows
from runfleet.producer import AsyncQueue, AsyncRun
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.fleet.procs import records
from tests.lifecycle.test_history import _executed
from tests.ops.conftest import Cli


async def _role(store: Store) -> str:
    row = await store.db.one("forks.session_role", {})
    assert row is not None
    return str(row["role"])


async def test_fork_from_step_n_replays_the_first_n_calls(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path, cli: Cli
) -> None:
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.four_steps, str(ledger), str(tmp_path / "no"), 0)
    await run.result(timeout=20)
    done = await cli("fork", run.id, "--from-step", "3", "--id", "cli-fork", "--actor", "ops")
    assert done.code == 0, done
    assert done.stdout.startswith(
        f"run {run.id} forked into cli-fork, which replays its first 3 recorded call(s)"
    )
    result = await AsyncRun(queue, "cli-fork").result(timeout=20)
    assert [r["i"] for r in result] == [0, 1, 2, 3]
    # s0 and s1 ran on the source only; s2 and s3 (from call 3 on) ran again on the fork.
    assert await _executed(ledger) == ["step0", "step1", "step2", "step3", "step2", "step3"]
    role = await _role(store)
    (forked,) = await records(store, run.id, "forked")
    assert forked.payload == {"to": "cli-fork", "calls": 3, "actor": role, "note": "ops"}
    (copied,) = await records(store, "cli-fork", "history-copied")
    assert copied.payload["actor"] == role and copied.payload["from"] == run.id
    journal = (await cli("journal", run.id)).stdout
    assert f"forked into cli-fork, which replays its first 3 recorded call(s) by {role} (ops)" in (
        journal
    )
    as_json = json.loads((await cli("fork", run.id, "--from-step", "0", "--json")).stdout)
    assert as_json["action"] == "forked" and as_json["calls"] == 0


async def test_resume_continues_a_failed_run_and_delete_removes_it(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path, cli: Cli
) -> None:
    ledger, flag = tmp_path / "ledger", tmp_path / "fail"
    flag.touch()
    run = await queue.enqueue(flows.four_steps, str(ledger), str(flag), 0)
    assert await _settled(queue, run) is RunStatus.FAILED
    flag.unlink()
    bad = await cli("resume", run.id, "--accept-recorded")
    assert bad.code == 1 and "are for a quarantined run" in bad.stderr, bad
    done = await cli("resume", run.id, "--actor", "ops")
    assert done.code == 0, done
    assert done.stdout.startswith(
        f"run {run.id} resumed as {run.id}@1, which replays its first 3 recorded call(s)"
    )
    assert [r["i"] for r in await AsyncRun(queue, f"{run.id}@1").result(timeout=20)] == [0, 1, 2, 3]
    (mark,) = await records(store, run.id, "resumed-as")
    assert mark.payload["actor"] == await _role(store) and mark.payload["note"] == "ops"
    deleted = await cli("delete", run.id, "--json")
    assert deleted.code == 0, deleted
    answer = json.loads(deleted.stdout)
    assert answer["action"] == "deleted" and answer["deleted_run_ids"] == [run.id, f"{run.id}@1"]
    assert await store.runs.get(run.id) is None and await store.runs.get(f"{run.id}@1") is None


async def test_bad_input_is_refused_with_its_reason(
    worker: Worker, queue: AsyncQueue, tmp_path: Path, cli: Cli
) -> None:
    open_run = await queue.enqueue(flows.progress)
    assert await queue.get_event(open_run.id, "stage", timeout=20) == {"n": 1}
    cases = {
        ("delete", open_run.id): "is not settled",
        ("fork", open_run.id, "--from-step", "-1"): "must be an integer >= 0",
        ("fork", open_run.id, "--from-step", "9"): "recorded 1 calls, not 9",
        ("resume", open_run.id): "is not quarantined or parked dead",
        ("fork", "no-such-run", "--from-step", "0"): "no-such-run",
        ("delete", "no-such-run"): "no-such-run",
    }
    for args, reason in cases.items():
        seen = await cli(*args)
        assert seen.clean and seen.code == 1 and reason in seen.stderr, (args, seen)
    typo = await cli("fork", open_run.id, "--from-step", "three")
    assert typo.clean and typo.code == 2  # typer's own usage error
    assert (await open_run.fetch()).status is RunStatus.SUSPENDED
    await queue.send(open_run.id, "go", 1)
    await open_run.result(timeout=20)


async def _settled(queue: AsyncQueue, run: AsyncRun) -> RunStatus:
    try:
        await run.result(timeout=20)
    except Exception:
        pass
    return (await run.fetch()).status
