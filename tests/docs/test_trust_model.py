"""The trust model's promise table: every promise names tests, and those tests exist.

docs/explanation/trust-model.md, "Each promise and the test that proves it": a row whose
test was renamed or deleted would leave a promise nobody checks, so it fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "trust-model.md"
HEADING = "## Each promise and the test that proves it"


def _promises() -> dict[str, list[str]]:
    text = PAGE.read_text()
    assert HEADING in text, f"{PAGE} lost its heading {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("Promise", "") or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = re.findall(r"`(tests/[^`]+)`", cells[1])
    return rows


def _exists(reference: str) -> bool:
    path, _, name = reference.partition("::")
    target = ROOT / path
    if not name:
        return target.exists()
    if not target.is_file():
        return False
    tree = ast.parse(target.read_text())
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.name == name.split("[")[0]
        for node in ast.walk(tree)
    )


def test_every_promise_names_tests_that_exist() -> None:
    promises = _promises()
    assert len(promises) >= 10, "the promise table is gone or was cut short"
    for promise, tests in promises.items():
        assert tests, f"no test proves: {promise[:80]}"
        missing = [t for t in tests if not _exists(t)]
        assert not missing, f"{missing} named for: {promise[:80]}"
        for test in tests:
            path = ROOT / test.partition("::")[0]
            files = [path] if path.is_file() else sorted(path.rglob("test_*.py"))
            assert files, f"{test} holds no test file"
