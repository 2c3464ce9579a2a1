"""A scoped operator sees the concurrency keys of the runs it may read, in ``queue show``,
``fleet`` and ``explain``, and never another tenant's key values (row security decides:
runfleet.queue_keys' policy shows a key only beside an open run the reader may read)."""

from __future__ import annotations

from runfleet.ops.cli.common import connect
from runfleet.ops.dashboard.data import JournalTail, overview
from runfleet.store import Store
from runfleet.store.roles import GroupRole
from runfleet.store.types import Activated, AtLimit, NewRun, Owner
from tests.ops.conftest import cli_env, invoke
from tests.security.conftest import MakeLogin

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, tenant: str, scope: str) -> None:
    await store.admission.create(
        NewRun(
            id=run_id,
            flow=FLOW,
            queue="shared",
            payload={"args": [1], "kwargs": {"t": tenant}},
            scopes=(scope,),
        )
    )


async def test_a_scoped_operator_sees_its_own_keys_only(store: Store, login: MakeLogin) -> None:
    await store.queues.set("shared", key_flow=(FLOW, "kwargs.t"), concurrency=4, key_concurrency=1)
    await admit(store, "a0", "acme-secret", "s1")
    await admit(store, "a1", "acme-secret", "s1")
    await admit(store, "b0", "bolt-secret", "s2")
    await admit(store, "b1", "bolt-secret", "s2")
    for run_id in ("a0", "b0"):
        out = (await store.runs.claim_if_fresh(run_id, FLOW, ME)).outcome
        assert isinstance(out, Activated) and out.row.id == run_id
    assert isinstance((await store.runs.claim_if_fresh("a1", FLOW, ME)).outcome, AtLimit)
    operator = await login(GroupRole.OPERATOR, "s1")
    env = cli_env(operator.settings)
    shown = await invoke(env, "queue", "show", "shared")
    assert shown.code == 0 and "acme-secret: 1 running, 1 waiting" in shown.stdout, shown
    fleet = await invoke(env, "fleet")
    assert "key acme-secret: 1 running, 1 waiting" in fleet.stdout, fleet
    explained = await invoke(env, "explain", "a1")
    assert "waiting for a slot of key acme-secret of queue shared: 1 of 1 in use" in (
        explained.stdout
    ), explained
    as_json = await invoke(env, "fleet", "--json")
    for text in (shown.stdout, fleet.stdout, explained.stdout, as_json.stdout):
        assert "bolt-secret" not in text, text
    async with connect(operator.settings, redis="optional") as conns:
        view = await overview(conns, JournalTail())
    (limits,) = view.limits
    assert [(k.key, k.running, k.waiting) for k in limits.keys] == [("acme-secret", 1, 1)]
    # Raw SQL with the operator's credentials: the other tenant's key is not there.
    mine = await Store.open(operator.settings)
    try:
        assert {k.key for k in await mine.queues.keys("shared")} == {"acme-secret"}
    finally:
        await mine.close()
