"""``enqueue``, ``runs``, ``show``, ``journal``, ``tree`` and ``cancel`` against real services.

No worker runs here, so every run stays where the CLI put it and each listing is exact.
"""

from __future__ import annotations

import uuid

import tests.fleet.flows  # noqa: F401  (this producer has loaded the module ADD names)
from runfleet.ops.models import (
    CancelResult,
    EnqueueResult,
    JournalView,
    RunDetail,
    RunList,
    TreeView,
)
from runfleet.store import Store
from runfleet.store.types import (
    Activated,
    NewRun,
    OnParentExit,
    Owner,
    Parked,
    RunStatus,
    Waiting,
    WaitingReason,
)
from tests.ops.conftest import Cli

ADD = "tests.fleet.flows:add"  # importable: admitted without any worker having registered it


async def _enqueue(cli: Cli, *args: str) -> EnqueueResult:
    raw = await cli("enqueue", *args, "--json")
    assert raw.code == 0 and raw.clean, raw
    return EnqueueResult.model_validate_json(raw.stdout)


async def test_enqueue_payload_forms_and_idempotent_ids(store: Store, cli: Cli) -> None:
    as_list = await _enqueue(cli, ADD, "--payload", "[1, 2]")
    as_object = await _enqueue(cli, ADD, "--payload", '{"a": 1, "b": 2}', "--queue", "q2")
    explicit = await _enqueue(
        cli, ADD, "--payload", '{"args": [1], "kwargs": {"b": 2}}', "--id", "fixed-1"
    )
    payloads = {}
    for result in (as_list, as_object, explicit):
        row = await store.runs.get(result.run_id)
        assert row is not None and row.status is RunStatus.PENDING
        payloads[result.run_id] = row.payload
    assert payloads[as_list.run_id] == {"args": [1, 2], "kwargs": {}}
    assert payloads[as_object.run_id] == {"args": [], "kwargs": {"a": 1, "b": 2}}
    assert payloads[explicit.run_id] == {"args": [1], "kwargs": {"b": 2}}
    assert as_object.queue == "q2" and explicit.run_id == "fixed-1"

    joined = await _enqueue(
        cli, ADD, "--payload", '{"args": [1], "kwargs": {"b": 2}}', "--id", "fixed-1"
    )
    assert joined.run_id == "fixed-1"
    conflict = await cli("enqueue", ADD, "--payload", "[9, 9]", "--id", "fixed-1")
    assert conflict.code == 1 and conflict.clean
    assert "already exists with a different payload" in conflict.stderr

    text = await cli("enqueue", ADD, "--payload", "[3, 4]")
    assert text.code == 0 and "is pending" in text.stdout


async def test_enqueue_refuses_unknown_flows_unless_late_bound(cli: Cli) -> None:
    refused = await cli("enqueue", "nobody.knows", "--payload", "[]")
    assert refused.code == 1 and refused.clean
    assert "unknown flow 'nobody.knows'" in refused.stderr
    late = await _enqueue(cli, "nobody.knows", "--late-binding")
    assert late.flow == "nobody.knows"


async def test_runs_filters_and_json(cli: Cli) -> None:
    first = await _enqueue(cli, ADD, "--payload", "[1, 1]")
    second = await _enqueue(cli, ADD, "--payload", "[2, 2]", "--queue", "other")
    listing = RunList.model_validate_json((await cli("runs", "--json")).stdout)
    assert [r.id for r in listing.runs] == [second.run_id, first.run_id]  # newest first
    other = RunList.model_validate_json((await cli("runs", "--queue", "other", "--json")).stdout)
    assert [r.id for r in other.runs] == [second.run_id]
    pending = await cli("runs", "--status", "pending", "--flow", ADD, "--since", "1h", "--json")
    assert {r.id for r in RunList.model_validate_json(pending.stdout).runs} == {
        first.run_id,
        second.run_id,
    }
    none = await cli("runs", "--status", "completed", "--json")
    assert RunList.model_validate_json(none.stdout).runs == []
    limited = await cli("runs", "--limit", "1", "--json")
    assert len(RunList.model_validate_json(limited.stdout).runs) == 1
    text = await cli("runs")
    assert text.code == 0 and first.run_id in text.stdout and "2 run(s)" in text.stdout
    bad = await cli("runs", "--since", "yesterday-ish")
    assert bad.code == 2 and bad.clean and "Invalid value for '--since'" in bad.stderr
    bad_status = await cli("runs", "--status", "sleeping")
    assert bad_status.code == 2 and bad_status.clean


async def test_show_journal_and_cancel_of_a_pending_run(cli: Cli) -> None:
    run = await _enqueue(cli, ADD, "--payload", "[5, 6]", "--id", f"show-{uuid.uuid4().hex[:6]}")
    detail = RunDetail.model_validate_json((await cli("show", run.run_id, "--json")).stdout)
    assert detail.run.id == run.run_id and detail.state["payload"]["args"] == [5, 6]
    assert detail.parents == [] and detail.children == []
    shown = await cli("show", run.run_id)
    assert shown.code == 0 and run.run_id in shown.stdout and "pending" in shown.stdout

    cancelled = CancelResult.model_validate_json((await cli("cancel", run.run_id, "--json")).stdout)
    assert cancelled.outcome == "requested" and cancelled.status is RunStatus.PENDING
    again = CancelResult.model_validate_json((await cli("cancel", run.run_id, "--json")).stdout)
    assert again.outcome == "already-requested"

    journal = JournalView.model_validate_json((await cli("journal", run.run_id, "--json")).stdout)
    kinds = [e.kind for e in journal.entries]
    assert kinds == ["created", "cancel-requested"]
    asked = journal.entries[1].sentence  # the role decides; the CLI's actor is a note
    assert asked.startswith("cancellation requested while pending by postgres (cli:")
    text = await cli("journal", run.run_id)
    assert f"created as {ADD} on queue default" in text.stdout


async def test_tree_shows_children_rounds_and_waits(store: Store, cli: Cli) -> None:
    root = f"root-{uuid.uuid4().hex[:6]}"
    await store.admission.create(NewRun(id=root, flow="tests.forever", payload={"args": []}))
    attached, detached, grandchild = f"{root}-a", f"{root}-d", f"{root}-a-g"
    await store.admission.create(NewRun(id=attached, flow="tests.forever", parent_id=root))
    await store.admission.create(
        NewRun(
            id=detached, flow="tests.forever", parent_id=root, on_parent_exit=OnParentExit.DETACH
        )
    )
    await store.admission.create(NewRun(id=grandchild, flow="tests.forever", parent_id=attached))
    await store.admission.create(
        NewRun(
            id=f"{root}@1",
            flow="tests.forever",
            lineage_id=root,
            round_ordinal=1,
            previous_round_id=root,
        )
    )
    ghost = Owner("ghost-host", 4_000_002, "0badc0ffee02")
    row = await store.runs.get(grandchild)
    assert row is not None
    activated = await store.runs.claim_and_activate(grandchild, row.snapshot, ghost)
    assert isinstance(activated, Activated)
    parked = await store.waits.park(
        grandchild, ghost, activated.row.epoch, Waiting(reason=WaitingReason.EVENT, token="t-1")
    )
    assert isinstance(parked, Parked)

    view = TreeView.model_validate_json((await cli("tree", root, "--json")).stdout)
    assert [(n.run.id, n.attached) for n in view.children] == [(attached, True), (detached, False)]
    assert [n.run.id for n in view.children[0].children] == [grandchild]
    assert [r.id for r in view.rounds] == [root, f"{root}@1"]
    assert [(w.run_id, w.reason, w.token) for w in view.waiting] == [(grandchild, "event", "t-1")]
    text = await cli("tree", root)
    assert text.code == 0
    assert "(detached)" in text.stdout and grandchild in text.stdout
    assert f"rounds of lineage {root}:" in text.stdout and "waiting on:" in text.stdout
