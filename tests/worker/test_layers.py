"""The worker's three layers: its plumbing, the flow author's room above it, the fleet
machinery on top; and no import cycle among worker modules wider than two.

Every import counts, function-local and ``TYPE_CHECKING`` ones too: a cycle hidden in a
function is still a cycle. ``from runfleet.worker import metrics`` is an import of the
package as well (its ``__init__`` re-exports the room), so submodules name submodules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"
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


def _modules() -> dict[str, Path]:
    found = {}
    for path in WORKER.rglob("*.py"):
        parts = path.relative_to(WORKER).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("runfleet", "worker", *parts))] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the worker modules it imports (packages included, as Python loads them)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found


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


def test_no_import_cycle_among_worker_modules_is_wider_than_two() -> None:
    wide = [sorted(c) for c in _components(_graph()) if len(c) > 2]
    assert not wide, wide
