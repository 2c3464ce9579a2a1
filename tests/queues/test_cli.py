"""``runfleet queue set/show``: limits change live, journaled with the database role."""

from __future__ import annotations

import json

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Activated, AtLimit, NewRun, Owner
from tests.ops.conftest import cli_env, invoke

FLOW = "tests.queues.flows:nap"


async def test_set_then_show_and_the_next_claim_obeys(store: Store, settings: Settings) -> None:
    env = cli_env(settings)
    done = await invoke(env, "queue", "set", "reports", "--concurrency", "1", "--note", "db load")
    assert done.code == 0, done
    assert "queue reports: concurrency 1, default priority 0" in done.stdout
    me = Owner("host", 1, "n")
    for i in range(2):
        await store.admission.create(NewRun(id=f"rep{i}", flow=FLOW, queue="reports"))
    first = (await store.runs.claim_if_fresh("rep0", FLOW, me)).outcome
    second = (await store.runs.claim_if_fresh("rep1", FLOW, me)).outcome
    assert isinstance(first, Activated) and isinstance(second, AtLimit)
    explained = await invoke(env, "explain", "rep1")
    assert explained.code == 0, explained
    assert "waiting for a slot of queue reports: 1 of 1 in use fleet-wide" in explained.stdout
    shown = await invoke(env, "queue", "show", "reports", "--json")
    assert shown.code == 0, shown
    (info,) = json.loads(shown.stdout)["queues"]
    assert info["concurrency"] == 1 and info["running"] == 1
    (change,) = info["changes"]
    assert change["change"] == {"concurrency": 1} and change["note"] == "db load"
    assert change["changed_by"] == "postgres"  # the authenticated role, never a free text
    fleet = await invoke(env, "fleet", "--json")
    assert fleet.code == 0, fleet
    assert json.loads(fleet.stdout)["queues"] == [
        {
            "name": "reports",
            "concurrency": 1,
            "running": 1,
            "default_priority": 0,
            "rate_per_s": None,
            "keyed": False,
            "key_concurrency": None,
            "key_rate_per_s": None,
            "keys": [],
        }
    ]
    text = await invoke(env, "fleet")
    assert "queue reports: 1/1 slots in use, default priority 0" in text.stdout
    lifted = await invoke(env, "queue", "set", "reports", "--concurrency", "0")
    assert "unlimited" in lifted.stdout
    again = (await store.runs.claim_if_fresh("rep1", FLOW, me)).outcome
    assert isinstance(again, Activated)


async def test_bad_settings_are_one_clear_line(settings: Settings) -> None:
    env = cli_env(settings)
    refused = await invoke(env, "queue", "set", "reports", "--concurrency", "-2")
    assert refused.code == 1 and "concurrency" in refused.stderr and refused.clean
    nothing = await invoke(env, "queue", "set", "reports")
    assert nothing.code == 1 and "at least one setting" in nothing.stderr
    unknown = await invoke(env, "queue", "show", "nowhere")
    assert unknown.code == 1 and "no settings" in unknown.stderr
