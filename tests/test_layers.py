"""The dependency rule, read from every import of every package (top level, inside a
function, under ``TYPE_CHECKING``): each package imports only those beneath it, and no
import cycle spans more than two modules (docs/design.md, Layers; docs/explanation/code-map.md).

The checker (``tests.support.layers``) is itself tested: on small graphs, and on a copy of
the checkout with an upward import planted in it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import layers
from tests.support.layers import Edge

PACKAGES = tuple(layers.BENEATH)


def test_every_package_is_read() -> None:
    """Each folder ``runfleet/`` links to has its place in the table (a new one needs it)."""
    linked = {p.name for p in (layers.ROOT / layers.TOP).iterdir() if p.is_symlink()}
    assert linked == set(PACKAGES)
    found = layers.modules()
    assert {layers.package_of(m) for m in found} == {*PACKAGES, layers.TOP}
    assert "runfleet.declaration.flow" in found and "runfleet.rqface.sync" in found
    assert found["runfleet.store"].name == "__init__.py"
    assert len(found) > 150


def test_each_package_imports_only_the_packages_beneath_it() -> None:
    wrong = layers.upward(layers.edges(layers.modules()))
    assert not wrong, "\n".join(f"{e.source} imports {e.target} (line {e.line})" for e in wrong)


def test_runtime_imports_no_runfleet_package() -> None:
    found = layers.edges(layers.modules())
    assert not [
        e for e in found if layers.package_of(e.source) == "runtime" != layers.package_of(e.target)
    ]


def test_no_import_cycle_spans_more_than_two_modules() -> None:
    wide = layers.wide_cycles(layers.edges(layers.modules()))
    assert not wide, "\n".join(f"{len(c)} modules: {', '.join(c)}" for c in wide)


def test_producer_and_worker_meet_only_through_the_declaration() -> None:
    """The producer reads a flow's declaration; it never imports the worker, nor rq's face."""
    found = layers.edges(layers.modules())
    producer = {
        layers.package_of(e.target) for e in found if layers.package_of(e.source) == "producer"
    }
    assert not producer & {"worker", "rqface", "ops"}
    assert "declaration" in producer


# ---- the checker itself ------------------------------------------------------


def _edge(source: str, target: str) -> Edge:
    return Edge(f"runfleet.{source}", f"runfleet.{target}", 1)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("store.runs", "broker.streams"),
        ("store.runs", "declaration.flow"),
        ("runtime.batching", "store.db"),
        ("broker.streams", "producer.queue"),
        ("declaration.flow", "worker.flows"),
        ("producer.queue", "rqface.jobs"),
        ("rqface.sync", "worker.context"),
        ("worker.driver", "ops.cli.app"),
        ("worker.driver", ""),
    ],
)
def test_an_upward_import_is_found(source: str, target: str) -> None:
    edge = Edge(f"runfleet.{source}", f"runfleet.{target}".rstrip("."), 1)
    assert layers.upward([edge]) == [edge]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("ops.cli.app", "worker.process"),
        ("worker.settle", "declaration.targets"),
        ("rqface.jobs", "producer.run"),
        ("producer.queue", "broker.streams"),
        ("declaration.targets", "store.validate"),
        ("store.runs", "runtime.batching"),
        ("worker.flows", "worker.instances"),
    ],
)
def test_a_downward_import_is_allowed(source: str, target: str) -> None:
    assert layers.upward([_edge(source, target)]) == []


def test_cycles_wider_than_two_are_found() -> None:
    pair = [_edge("worker.a", "worker.b"), _edge("worker.b", "worker.a")]
    assert layers.cycles(pair) == [["runfleet.worker.a", "runfleet.worker.b"]]
    assert layers.wide_cycles(pair) == []
    triangle = [
        _edge("rqface.a", "rqface.b"),
        _edge("rqface.b", "rqface.c"),
        _edge("rqface.c", "rqface.a"),
    ]
    assert layers.wide_cycles([*triangle, _edge("rqface.c", "store.x")]) == [
        ["runfleet.rqface.a", "runfleet.rqface.b", "runfleet.rqface.c"]
    ]
    chain = [_edge("store.a", "store.b"), _edge("store.b", "store.c")]
    assert layers.cycles(chain) == []


def _copy_of_the_checkout(tmp_path: Path) -> Path:
    """The product's folders and ``runfleet/``'s links to them, copied under ``tmp_path``."""
    (tmp_path / layers.TOP).mkdir()
    for entry in (layers.ROOT / layers.TOP).iterdir():
        if entry.is_symlink():
            shutil.copytree(
                entry.resolve(), tmp_path / entry.name, ignore=shutil.ignore_patterns("__pycache__")
            )
            (tmp_path / layers.TOP / entry.name).symlink_to(Path("..") / entry.name)
        elif entry.suffix == ".py":
            shutil.copy(entry, tmp_path / layers.TOP / entry.name)
    return tmp_path


def test_an_import_planted_upward_in_a_copy_is_refused(tmp_path: Path) -> None:
    root = _copy_of_the_checkout(tmp_path)
    before = {(e.source, e.target) for e in layers.upward(layers.edges(layers.modules(root)))}
    target = root / "store" / "validate.py"
    # inside a function and under TYPE_CHECKING: both count
    target.write_text(
        target.read_text()
        + "\n\ndef _planted() -> None:\n"
        + "    from runfleet.producer.queue import AsyncQueue  # noqa\n"
        + "\n\nif TYPE_CHECKING:\n    from runfleet.worker import resolver  # noqa\n"
    )
    after = {(e.source, e.target) for e in layers.upward(layers.edges(layers.modules(root)))}
    assert after - before == {
        ("runfleet.store.validate", "runfleet.producer.queue"),
        ("runfleet.store.validate", "runfleet.worker"),
        ("runfleet.store.validate", "runfleet.worker.resolver"),
    }


def test_a_cycle_planted_in_a_copy_is_refused(tmp_path: Path) -> None:
    root = _copy_of_the_checkout(tmp_path)
    before = layers.wide_cycles(layers.edges(layers.modules(root)))
    # declaration.flow <- declaration.names <- declaration.targets; close the loop
    flow = root / "declaration" / "flow.py"
    flow.write_text(
        flow.read_text()
        + "\n\ndef _planted() -> None:\n    from runfleet.declaration import targets  # noqa\n"
    )
    after = layers.wide_cycles(layers.edges(layers.modules(root)))
    new = [c for c in after if c not in before]
    assert any(
        {"runfleet.declaration.flow", "runfleet.declaration.targets", "runfleet.declaration.names"}
        <= set(c)
        for c in new
    ), new
