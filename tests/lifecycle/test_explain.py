"""``runfleet explain`` tells a run's events and messages, and what a recv waits for."""

from __future__ import annotations

from pathlib import Path

import tests.lifecycle.flows as flows
from runfleet.ops.models import Explanation
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.ops.conftest import Cli


async def test_explain_says_a_recv_waits_for_a_message_and_what_was_set(
    worker: Worker, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    run = await queue.enqueue(flows.progress)
    await parked(store, run.id, "event", timeout=20)
    raw = await cli("explain", run.id, "--json")
    assert raw.code == 0, raw.stderr
    explained = Explanation.model_validate_json(raw.stdout)
    assert "waiting for a message on 'go'" in explained.next.summary
    assert not explained.next.needs_person
    text = "\n".join(explained.lines)
    assert "events: 'stage' (set 1x" in text
    await queue.send(run.id, "go", 1)
    await run.result(timeout=20)
    text = (await cli("explain", run.id)).stdout
    assert "events: 'stage' (set 3x" in text
    assert "messages: 1 sent, 1 received." in text
    assert "message 1 on 'go' received by 'recv:go#1'" in text


async def test_explain_counts_the_attempts_that_timed_out(
    worker: Worker, queue: AsyncQueue, cli: Cli, tmp_path: Path
) -> None:
    run = await queue.enqueue(flows.async_timeout, str(tmp_path / "l"), 2, 3)
    await run.result(timeout=30)
    text = (await cli("explain", run.id)).stdout
    assert "step timeouts: 2 attempt(s) ran past their timeout ('step:call#1' 2x)" in text
