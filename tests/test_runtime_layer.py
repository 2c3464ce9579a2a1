"""``runtime/`` (the service lifecycle, group commit) imports no runfleet package, so every
layer may import it; and the service and batching machinery lives there, not in a layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_runtime_imports_no_runfleet_package() -> None:
    modules = sorted((ROOT / "runtime").rglob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "service.py", "batching.py"}
    for module in modules:
        ours = {
            name
            for name in _imports(module)
            if name.split(".")[0] in ("runfleet", "store", "broker", "worker", "ops")
        }
        assert not ours, (module, ours)


def test_the_layers_import_the_machinery_from_runtime() -> None:
    """No module but the one compatibility re-export imports it from ``broker``."""
    shim = ROOT / "broker" / "batching.py"
    for top in ("store", "broker", "worker", "ops"):
        for module in (ROOT / top).rglob("*.py"):
            if module == shim:
                continue
            names = _imports(module)
            assert "runfleet.broker.service" not in names, module
            assert "runfleet.broker.batching" not in names, module
