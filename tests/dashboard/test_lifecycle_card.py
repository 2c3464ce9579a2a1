"""The run page's lifecycle card and ``/api/runs/<id>/lifecycle``: the version a run was
admitted with, the events it set, and the forks and resumes linking it to other runs."""

from __future__ import annotations

from pathlib import Path

import tests.lifecycle.flows as lf
import tests.lifecycle.versions_v1 as v1
from runfleet.ops.dashboard.models import LifecycleView
from runfleet.ops.dashboard.urls import run_url
from runfleet.producer import AsyncQueue
from runfleet.worker.process import Worker
from tests.dashboard.conftest import Dash


async def _card(client: object, run_id: str) -> LifecycleView:
    answer = await client.get(f"/api/runs/{run_id}/lifecycle")  # type: ignore[attr-defined]  # the fixture's test client, typed object here
    assert answer.status_code == 200, answer.text
    return LifecycleView.model_validate_json(answer.text)


def _section(page: str) -> str:
    return page.split('<div id="lifecycle"', 1)[1].split("</div>", 1)[0]


async def test_the_run_page_shows_version_events_and_forks(
    worker: Worker, queue: AsyncQueue, dashboard: Dash, tmp_path: Path
) -> None:
    client = await dashboard()
    run = await queue.enqueue(lf.four_steps, str(tmp_path / "ledger"), str(tmp_path / "no"), 0)
    await run.result(timeout=20)
    fork = await queue.fork(run.id, 3, new_run_id="card-fork", actor="ops")
    await fork.result(timeout=20)

    card = await _card(client, run.id)
    assert card.version is None and [e.key for e in card.events] == ["stage"]
    assert card.events[0].version == 2  # set twice: "after s0", then "done"
    (linked,) = card.forks
    assert (linked.run_id, linked.kind, linked.calls, linked.note) == (
        "card-fork",
        "fork",
        3,
        "ops",
    )
    page = _section((await client.get(run_url(run.id))).text)
    assert 'id="forks"' in page and f'href="{run_url("card-fork")}"' in page
    assert "replays 3 call(s)" in page and '<td class="mono">stage</td>' in page
    assert "&#34;done&#34;" in page  # the event's value, as JSON (escaped)

    copied = await _card(client, "card-fork")
    assert (copied.forked_from, copied.replays) == (run.id, 3)
    page = _section((await client.get(run_url("card-fork"))).text)
    assert f'forked from <a class="mono" href="{run_url(run.id)}"' in page

    versioned = await queue.enqueue(v1.strict)
    assert (await _card(client, versioned.id)).version == "v1"
    assert "version: <code>v1</code>" in _section((await client.get(run_url(versioned.id))).text)
    assert (await client.get("/api/runs/no-such-run/lifecycle")).status_code == 404
