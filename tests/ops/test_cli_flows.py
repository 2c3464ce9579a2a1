"""Answering durable flows from the shell: complete, approve, deny, resume."""

from __future__ import annotations

import json
import uuid

import psycopg

import tests.flows.flows as f
from runfleet.ops.models import AnswerResult
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.ops.conftest import Cli


async def test_complete_and_approve_from_the_cli(
    worker: Worker, settings: Settings, store: Store, cli: Cli
) -> None:
    async with AsyncQueue("default", settings=settings) as q:
        waiting = await q.enqueue(f.sync_flow, uuid.uuid4().hex[:6])
        await parked(store, waiting.id, "event")
        done = await cli("complete", waiting.id, "go", "--value", '"from-cli"', "--json")
        assert done.code == 0, done.stderr
        assert AnswerResult.model_validate_json(done.stdout).action == "completed"
        assert (await waiting.result(timeout=10))[1] == "from-cli"

        asking = await q.enqueue(f.approver, 7)
        row = await parked(store, asking.id, "approval")
        assert row.waiting is not None and row.waiting.token is not None
        wrong = await cli("approve", asking.id, "--token", "nope", "--actor", "eve")
        assert wrong.code != 0 and "not waiting for an approval" in wrong.stderr
        ok = await cli(
            "approve",
            asking.id,
            "--token",
            f.TOKENS[asking.id],
            "--actor",
            "ann",
            "--reason",
            "fine",
            "--value",
            json.dumps({"cap": 9}),
        )
        assert ok.code == 0, ok.stderr
        assert await asking.result(timeout=10) == {
            "approved": True,
            "actor": "postgres",  # the authenticated role; --actor is a note
            "value": {"cap": 9},
        }


async def test_complete_from_the_cli_says_which_value_stands(
    settings: Settings, store: Store, cli: Cli
) -> None:
    async with AsyncQueue("default", settings=settings) as q:
        waiting = await q.enqueue(f.sync_flow, uuid.uuid4().hex[:6])  # nobody runs it
    actions = []
    for value in ('"first"', '"first"', '"second"'):
        done = await cli("complete", waiting.id, "go", "--value", value, "--json")
        assert done.code == 0, done.stderr
        actions.append(AnswerResult.model_validate_json(done.stdout).action)
    assert actions == ["completed", "already-completed", "answered-otherwise"]


async def test_resume_a_quarantined_run_from_the_cli(
    worker: Worker, settings: Settings, store: Store, cli: Cli
) -> None:
    async with AsyncQueue("default", settings=settings) as q:
        run = await q.enqueue(f.steps, uuid.uuid4().hex[:6])
        await parked(store, run.id, "event")
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True
        ) as conn:
            await conn.execute(
                "UPDATE runfleet.steps SET output = '5' WHERE run_id = %s AND key = 'step:a#1'",
                (run.id,),
            )
        await q.complete(run.id, "go")
        await parked(store, run.id, "quarantine")
        both = await cli("resume", run.id)
        assert both.code != 0 and "exactly one" in both.stderr
        ok = await cli("resume", run.id, "--accept-recorded", "--actor", "ops")
        assert ok.code == 0, ok.stderr
        assert (await run.result(timeout=10))[0] == 5
