from store import Store
from store.config import Settings
from store.types import RunStatus, Waiting
from tests.store.helpers import OWNER_A, OWNER_B, extra_stores, make_running, must_get


async def test_probe(store: Store, settings: Settings) -> None:
    await make_running(store, "parent")
    await make_running(store, "child", OWNER_B, parent_id="parent")
    async with extra_stores(settings, 1) as (other,):
        async with other.transaction():
            await other.lifecycle.transition_owned("child", OWNER_B, 1, RunStatus.COMPLETED)
            parked = await store.waits.park("parent", OWNER_A, 1, Waiting("child"), deferred="child:child")
            print("park:", parked)
    print("parent:", (await must_get(store, "parent")).waiting, await store.waits.deferred("parent", "child:child"))
