"""rq producer snippets, the patterns rq's documentation teaches, written against rq's API.

Each snippet gets what its setup provides — ``Queue(name)`` (rq: ``Queue(name,
connection=redis)``; runfleet: ``Queue(name, database_url=…, redis_url=…)``), the
``Job`` and ``Retry`` classes (the import), ``conn`` (what ``Job.fetch`` takes: the
Redis connection for rq, a queue for runfleet) — and returns what a user would look
at. The code between is the same for both; test_corpus.py asserts equal answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.rq_parity import jobs
from tests.support.polling import until_sync


@dataclass(frozen=True)
class Api:
    Queue: Callable[[str], Any]
    Job: Any
    Retry: Any
    Callback: Any
    conn: Any
    queue_name: str
    """The queue a worker serves (``idle_queue_name`` has none)."""
    idle_queue_name: str
    tmp: Path


SNIPPET_WAIT_S = 40.0
"""How long a snippet polls a job (rq's docs poll without a bound; tests may not)."""


def basic_enqueue_and_poll(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    job = q.enqueue(jobs.add, 2, 3)
    until_sync(lambda: job.is_finished, SNIPPET_WAIT_S)
    job.refresh()
    return {
        "status": job.get_status() == "finished",
        "value": job.return_value(),
        "func_name": job.func_name,
        "args": list(job.args),
        "kwargs": dict(job.kwargs),
        "origin": job.origin == q.name,
        "times": job.enqueued_at <= job.started_at <= job.ended_at,
        "latest_ok": job.latest_result().return_value,
    }


def custom_job_id_and_fetch(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    job = q.enqueue(jobs.echo, 1, key="v", job_id=f"my-job-{api.tmp.name}")
    until_sync(lambda: job.is_finished, SNIPPET_WAIT_S)
    fetched = api.Job.fetch(job.id, connection=api.conn)
    by_queue = q.fetch_job(job.id)
    return {
        "id": job.id == f"my-job-{api.tmp.name}",
        "fetched": (fetched.id == job.id, fetched.args, fetched.kwargs),
        "by_queue": by_queue is not None and by_queue.return_value(),
        "missing": q.fetch_job("no-such-job-anywhere"),
        "many": [
            j and j.id == job.id
            for j in api.Job.fetch_many([job.id, "no-such-job"], connection=api.conn)
        ],
    }


def retries(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    ok_path, bad_path = api.tmp / "ok-tries", api.tmp / "bad-tries"
    ok = q.enqueue(jobs.flaky, str(ok_path), 2, retry=api.Retry(max=3, interval=[1, 1]))
    bad = q.enqueue(jobs.flaky, str(bad_path), 5, retry=api.Retry(max=1))
    until_sync(lambda: ok.is_finished, SNIPPET_WAIT_S)
    until_sync(lambda: bad.is_failed, SNIPPET_WAIT_S)
    return {
        "ok": ok.return_value(),
        "ok_tries": ok_path.read_text(),
        "bad_tries": bad_path.read_text(),
        "bad_in_registry": bad.id in q.failed_job_registry.get_job_ids(),
        "bad_exc": "RuntimeError: try 2 of 6" in (bad.latest_result().exc_string or ""),
    }


def depends_on_chain(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    path = str(api.tmp / "chain")
    a = q.enqueue(jobs.snooze, 1)
    b = q.enqueue(jobs.record, path, "b", depends_on=a)
    c = q.enqueue(jobs.record, path, "c", depends_on=[b])
    deferred = (b.get_status() == "deferred", c.is_deferred)
    until_sync(lambda: c.is_finished, SNIPPET_WAIT_S)
    return {
        "deferred_at_first": deferred,
        "result": c.return_value(),
        "order": Path(path).read_text(),
        "all_finished": [j.is_finished for j in (a, b, c)],
    }


def callbacks(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    good, bad = api.tmp / "good", api.tmp / "bad"
    ok = q.enqueue(jobs.record, str(good), "x", on_success=api.Callback(jobs.report_success))
    ko = q.enqueue(
        jobs.fail_unless_exists, str(bad), on_failure=api.Callback(jobs.report_failure, timeout=10)
    )
    until_sync(lambda: ok.is_finished and ko.is_failed, SNIPPET_WAIT_S)
    until_sync(
        lambda: Path(f"{good}.success").exists() and Path(f"{bad}.failure").exists(), SNIPPET_WAIT_S
    )
    success = json.loads(Path(f"{good}.success").read_text())
    failure = json.loads(Path(f"{bad}.failure").read_text())
    return {
        "success": (success["id"] == ok.id, success["result"]),
        "failure": (failure["id"] == ko.id, failure["error"], failure["message"] == str(bad)),
    }


def meta(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    job = q.enqueue(jobs.add, 1, 1, meta={"owner": "ann"}, description="adds")
    until_sync(lambda: job.is_finished, SNIPPET_WAIT_S)
    job.meta["progress"] = 100
    job.save_meta()
    fetched = api.Job.fetch(job.id, connection=api.conn)
    return {
        "meta": fetched.meta,
        "get_meta": job.get_meta(refresh=True),
        "description": fetched.description,
    }


def scheduling(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    started = time.monotonic()
    later = q.enqueue_in(timedelta(seconds=2), jobs.add, 1, 2)
    at = q.enqueue_at(datetime.now(UTC) + timedelta(seconds=1), jobs.add, 2, 2)
    scheduled = (later.is_scheduled, at.get_status() == "scheduled")
    not_in_queue = later.id not in q.job_ids
    until_sync(lambda: later.is_finished and at.is_finished, SNIPPET_WAIT_S)
    waited = time.monotonic() - started
    return {
        "scheduled_at_first": scheduled,
        "not_in_queue": not_in_queue,
        "values": (later.return_value(), at.return_value()),
        # rq's scheduler works in whole seconds (a 2 s delay can end ~1.1 s later on rq),
        # so the control only proves "not at once": at least 1 s.
        "waited_2s": waited >= 1.0,
    }


def failed_registry_requeue(api: Api) -> dict[str, Any]:
    q = api.Queue(api.queue_name)
    marker = api.tmp / "fixed"
    job = q.enqueue(jobs.fail_unless_exists, str(marker))
    until_sync(lambda: job.is_failed, SNIPPET_WAIT_S)
    registry = q.failed_job_registry
    before = (job.id in registry.get_job_ids(), registry.count)
    exc = "FileNotFoundError" in (job.latest_result().exc_string or "")
    marker.write_text("")
    registry.requeue(job.id)
    until_sync(lambda: job.is_finished, SNIPPET_WAIT_S)
    return {
        "before": before,
        "exc": exc,
        "value": job.return_value(),
        "after": (job.id in registry.get_job_ids(), registry.count),
    }


def queue_contents(api: Api) -> dict[str, Any]:
    q = api.Queue(api.idle_queue_name)  # no worker serves it: jobs stay queued
    first = q.enqueue(jobs.add, 1, 2)
    second = q.enqueue(jobs.add, 3, 4)
    listed = (q.count, q.job_ids == [first.id, second.id], [j.id for j in q.jobs])
    states = (first.is_queued, first.get_status() == "queued", q.is_empty())
    first.cancel()
    after_cancel = (first.is_canceled, q.count, q.job_ids == [second.id])
    q.empty()
    return {
        "listed": (listed[0], listed[1], listed[2] == [first.id, second.id]),
        "states": states,
        "after_cancel": after_cancel,
        "after_empty": (q.count, q.is_empty()),
    }


SNIPPETS: list[Callable[[Api], dict[str, Any]]] = [
    basic_enqueue_and_poll,
    custom_job_id_and_fetch,
    retries,
    depends_on_chain,
    callbacks,
    meta,
    scheduling,
    failed_registry_requeue,
    queue_contents,
]
