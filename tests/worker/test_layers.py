"""The worker's three layers: its plumbing, the flow author's room above it, the fleet
machinery on top (no cycle wider than two modules: ``tests/test_layers.py``).

Every import counts, function-local and ``TYPE_CHECKING`` ones too: a cycle hidden in a
function is still a cycle. ``from runfleet.worker import metrics`` is an import of the
package as well (its ``__init__`` re-exports the room), so submodules name submodules.
"""

from __future__ import annotations

from tests.support import layers

ROOM = "runfleet.worker.authoring"

PLUMBING = {
    f"runfleet.worker.{name}"
    for name in (
        "bookkeeping",
        "containment",
        "metrics",
        "retry",
        "threads",
        "tracing",
        "unrunnable",
        "wake_hints",
    )
}
"""What the room calls beneath it: none of it imports the room or the machinery."""


def _graph() -> dict[str, set[str]]:
    """Worker module -> the worker modules it imports, every import counted (the layer
    walk of ``tests/support/layers.py``, packages included as Python loads them)."""
    found = {name: path for name, path in layers.modules().items() if _in_worker(name)}
    graph: dict[str, set[str]] = {name: set() for name in found}
    for edge in layers.edges(found):
        if edge.source != edge.target and _in_worker(edge.target):
            graph[edge.source].add(edge.target)
    return graph


def _in_worker(name: str) -> bool:
    return name == "runfleet.worker" or name.startswith("runfleet.worker.")


def _in_room(name: str) -> bool:
    return name == ROOM or name.startswith(ROOM + ".")


def test_the_room_imports_only_itself_and_the_plumbing() -> None:
    graph = _graph()
    room = [name for name in graph if _in_room(name)]
    assert {f"{ROOM}.context", f"{ROOM}.flows", f"{ROOM}.replay"} <= set(room)
    for name in room:
        upward = {t for t in graph[name] if not _in_room(t) and t not in PLUMBING}
        assert not upward, f"{name} imports the fleet machinery: {sorted(upward)}"


def test_the_plumbing_imports_neither_the_room_nor_the_machinery() -> None:
    graph = _graph()
    assert PLUMBING <= set(graph)
    for name in sorted(PLUMBING):
        above = graph[name] - PLUMBING
        assert not above, f"{name} imports {sorted(above)}"


def test_room_modules_import_room_modules_not_its_package() -> None:
    """The room's ``__init__`` re-exports its modules: importing it from inside is a cycle."""
    graph = _graph()
    for name, edges in graph.items():
        if name != ROOM and _in_room(name):
            assert ROOM not in edges, name
        if name != "runfleet.worker":
            assert "runfleet.worker" not in edges, name
