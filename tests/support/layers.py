"""runfleet's import graph, read from the source (every import: top level, inside a
function, under ``TYPE_CHECKING``), and the two rules it must keep (docs/design.md, Layers):
each package imports only the packages beneath it, and no import cycle spans more than
two modules. ``tests/test_layers.py`` holds the checkout to them."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]

BENEATH: dict[str, frozenset[str]] = {
    "runtime": frozenset(),
    "store": frozenset({"runtime"}),
    "declaration": frozenset({"store", "runtime"}),
    "broker": frozenset({"store", "runtime"}),
    "producer": frozenset({"broker", "declaration", "store", "runtime"}),
    "rqface": frozenset({"producer", "broker", "declaration", "store", "runtime"}),
    "worker": frozenset({"rqface", "producer", "broker", "declaration", "store", "runtime"}),
    "ops": frozenset(
        {"runfleet", "worker", "rqface", "producer", "broker", "declaration", "store", "runtime"}
    ),
}
"""What each package may import: ``ops`` on top, then ``worker``, then rq's face over the
producer, then ``broker``, then ``store``, with the flow declaration and ``runtime``
beneath them. ``runfleet`` itself (the public names, ``python -m runfleet``) may import
them all, and only ``ops`` imports it."""

TOP = "runfleet"
WIDEST_CYCLE = 2


class Edge(NamedTuple):
    """``source`` imports ``target`` (both ``runfleet.…`` module names) at ``line``."""

    source: str
    target: str
    line: int


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the product, by import name: ``runfleet/*.py`` and the packages
    ``runfleet/`` links to (``runfleet.store`` is the checkout's ``store/``)."""
    found: dict[str, Path] = {}
    for path in sorted((root / TOP).glob("*.py")):
        name = TOP if path.stem == "__init__" else f"{TOP}.{path.stem}"
        found[name] = path
    for link in sorted((root / TOP).iterdir()):
        if not link.is_dir():
            continue
        for path in sorted(link.rglob("*.py")):
            parts = path.relative_to(root / TOP).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((TOP, *parts))] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    return [origin] + [f"{origin}.{alias.name}" for alias in node.names]


def edges(found: Mapping[str, Path]) -> list[Edge]:
    """Each import of one product module by another, wherever in the file it stands."""
    out: list[Edge] = []
    for module, path in found.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py"):
                if name in found and name != module:
                    out.append(Edge(module, name, getattr(node, "lineno", 0)))
    return out


def package_of(module: str) -> str:
    """``runfleet.worker.flows`` -> ``worker``; the public package's own modules -> ``runfleet``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in BENEATH:
        return TOP
    return parts[1]


def upward(found_edges: Iterable[Edge]) -> list[Edge]:
    """The imports that break the layering: into a package not beneath the importer's."""
    wrong = []
    for edge in found_edges:
        source, target = package_of(edge.source), package_of(edge.target)
        if source == target or source == TOP:
            continue
        if target not in BENEATH[source]:
            wrong.append(edge)
    return wrong


def cycles(found_edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module, widest first (Tarjan's
    algorithm, iterative: the graph is a few hundred modules deep at most)."""
    graph: dict[str, set[str]] = {}
    for edge in found_edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
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
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components, key=len, reverse=True)


def wide_cycles(found_edges: Iterable[Edge]) -> list[list[str]]:
    """The import cycles that span more than ``WIDEST_CYCLE`` modules."""
    return [c for c in cycles(found_edges) if len(c) > WIDEST_CYCLE]
