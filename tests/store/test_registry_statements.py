"""rq's listings read the dependency gate of every dependent in one statement
(``store.registries``): a queue of many dependents costs two statements to list, not one
per dependency, and each dependent's answer is the one ``dependencies_met`` gives alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.registries import Registries, RegistryKind
from tests.rq_parity import rq_fixtures as fixtures

DEPENDENTS = 30


def _counting(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the statements ``store.db.all`` runs from now on."""
    names: list[str] = []
    real: Callable[..., Any] = store.db.all

    async def counted(name: str, params: dict[str, Any] | None = None) -> Any:
        names.append(name)
        return await real(name, params)

    monkeypatch.setattr(store.db, "all", counted)
    return names


async def test_listing_many_dependents_is_two_statements(
    settings: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncQueue("deps", settings=settings) as queue:
        dependencies = [await queue.enqueue(fixtures.say_hello) for _ in range(3)]
        dependents = [
            await queue.enqueue(fixtures.say_hello, depends_on=[dependencies[i % 3].id])
            for i in range(DEPENDENTS)
        ]
        free = await queue.enqueue(fixtures.say_hello)
    registries = Registries(store)
    # rq's delete of a dependency meets its dependents' gate (a missing dependency is met)
    await registries.mark("deleted", [dependencies[1].id])
    # the gate alone, one dependent at a time, as a worker asks it
    alone = {
        d.id: (await registries.dependencies_met([dependencies[i % 3].id], False)).met
        for i, d in enumerate(dependents)
    }
    assert sum(alone.values()) == DEPENDENTS // 3  # the deleted one's; the others wait
    statements = _counting(store, monkeypatch)

    deferred = await registries.ids(RegistryKind.DEFERRED, "deps", [])
    assert statements == ["registries.by_status", "registries.answering_many"]
    assert {e.rq_id for e in deferred} == {d for d, met in alone.items() if not met}

    statements.clear()
    queued = await registries.queued("deps", [])
    assert statements == ["registries.queued", "registries.answering_many"]
    assert set(queued) == {dependencies[0].id, dependencies[2].id, free.id} | {
        d for d, met in alone.items() if met
    }

    statements.clear()
    left = [run_id async for run_id in registries.work_left(["deps"], horizon_ms=0)]
    assert statements == ["registries.work_left", "registries.answering_many"]
    assert {d.id for d in dependents} & set(left) == {d for d, met in alone.items() if met}
