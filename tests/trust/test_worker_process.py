"""A real ``runfleet worker`` process runs its --flows modules and --allow-import
prefixes, and nothing else."""

from __future__ import annotations

import pytest

import tests.trust.allowed as allowed
import tests.trust.flows as tf
import tests.trust.outside as outside
from runfleet.producer import AsyncQueue
from tests.fleet.procs import Spawn
from tests.support.polling import until


@pytest.mark.timeout(90)
async def test_a_worker_process_runs_only_what_it_allows(spawn: Spawn, queue: AsyncQueue) -> None:
    proc = spawn(flows="tests.trust.flows", extra_args=["--allow-import", "tests.trust.allowed"])
    flow_module = await queue.enqueue(tf.plain_add, 2, 3)
    prefixed = await queue.enqueue(allowed.triple, 5)
    refused = await queue.enqueue(outside.double, 7)
    assert await flow_module.result(timeout=30) == 5
    assert await prefixed.result(timeout=30) == 15

    async def logged() -> bool:
        return "run.unknown_flow" in proc.log() and refused.id in proc.log()

    await until(logged, 20, "the worker process to refuse the unallowed function")
    assert (await refused.fetch()).status.value == "pending"
