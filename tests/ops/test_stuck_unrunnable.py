"""``runfleet stuck`` names a pending run no live worker of its queue could run, at once.

Workers advertise the flows they registered and the modules they may import on their
liveness keys (``worker.carried``); a run whose flow none of the live workers serving its
queue has is reported after ``stale_after`` (waiting will not help it), not after
``--pending-for``. A run one of them could run is not.
"""

from __future__ import annotations

from runfleet.ops.models import StuckView
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.procs import Spawn
from tests.ops.conftest import Cli
from tests.support.polling import until


async def test_stuck_names_a_pending_run_no_live_worker_can_run(
    spawn: Spawn, store: Store, settings: Settings, cli: Cli
) -> None:
    worker = spawn()  # --flows tests.fleet.flows, RUNFLEET_ALLOW_IMPORT=tests
    await worker.wait_started()
    async with AsyncQueue("default", settings=settings, late_binding=True) as q:
        module = await q.enqueue("app.tasks:send_welcome", 1)  # a module it may not import
        name = await q.enqueue("orders.fulfil", 1)  # a flow name nobody registered
        runnable = await q.enqueue("tests.fleet.flows:add", 1, 2)
        assert await runnable.result(timeout=20) == 3

    async def reported() -> StuckView | None:
        raw = await cli("stuck", "--json")  # --pending-for 60s: not what reports these
        assert raw.code == 0, raw
        view = StuckView.model_validate_json(raw.stdout)
        return view if {module.id, name.id} <= {i.run.id for i in view.items} else None

    view = await until(reported, 20, "stuck to name both runs")
    items = {i.run.id: i for i in view.items}
    assert items[module.id].kind == "no-worker-can-run"
    assert "no function of module app.tasks may be imported" in items[module.id].detail
    assert "--allow-import app.tasks" in items[module.id].action
    assert items[name.id].kind == "no-worker-can-run"
    assert "flow orders.fulfil is not registered" in items[name.id].detail
    assert "1 live worker(s) serve queue default" in items[name.id].detail
    assert runnable.id not in items
