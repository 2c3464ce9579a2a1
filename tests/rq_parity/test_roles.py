"""rq's producer surface under least privilege: a runfleet_producer login role with a
scope saves meta, reads its failed registry and requeues, and sees nothing of another
scope's runs (row-level security, not only the Python check)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runfleet.producer import RunNotFound
from runfleet.rqface import Job, Queue
from runfleet.store.roles import GroupRole
from runfleet.worker.process import Worker
from tests.rq_parity import jobs
from tests.security.conftest import MakeLogin, login, role_worker  # noqa: F401 - fixtures
from tests.support.polling import until_sync


async def test_a_scoped_producer_role_meta_registry_requeue(
    login: MakeLogin,  # noqa: F811
    role_worker: Worker,  # noqa: F811
    tmp_path: Path,
) -> None:
    mine = await login(GroupRole.PRODUCER, "s1")
    other = await login(GroupRole.PRODUCER, "s2")
    marker = tmp_path / "fixed"

    def as_mine() -> tuple[str, dict[str, object], str]:
        with Queue("default", settings=mine.settings, scopes=["s1"]) as q:
            job = q.enqueue(jobs.fail_unless_exists, str(marker), meta={"a": 1})
            until_sync(lambda: job.is_failed, 20, "the job to fail")
            job.meta["b"] = 2
            job.save_meta()
            assert q.failed_job_registry.get_job_ids() == [job.id]
            marker.write_text("")
            q.failed_job_registry.requeue(job.id)
            return job.id, Job.fetch(job.id, connection=q).meta, str(job.wait(20))

    job_id, meta, value = await asyncio.to_thread(as_mine)
    assert meta == {"a": 1, "b": 2} and value == "ok"

    def as_other() -> None:
        with Queue("default", settings=other.settings, scopes=["s2"]) as q:
            assert q.fetch_job(job_id) is None
            assert q.failed_job_registry.get_job_ids() == []
            with pytest.raises(RunNotFound):
                q.failed_job_registry.requeue(job_id)

    await asyncio.to_thread(as_other)
