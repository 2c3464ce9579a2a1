"""mypy proves the explain renderer has a sentence for every journal payload type.

``journal_text.render`` matches on the decoded payload and ends in ``assert_never``: a
kind added to ``store.journal_records`` without a ``case`` is a type error. This test
removes each ``case`` in turn (one copy of the module per case) and checks mypy reports
every copy at its ``assert_never``, and the module as it is passes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import runfleet.ops.explain.journal_text as journal_text

ROOT = Path(__file__).resolve().parents[2]
_CASE = re.compile(r"^        case (jr\.[^:]+):\n", re.MULTILINE)


def _without_each_case(source: str) -> dict[str, str]:
    """One copy of ``source`` per ``case`` of ``render``, that case (and its body) removed."""
    start = source.index("def render(")
    end = source.index("        case _:\n            assert_never(p)", start)
    cases = list(_CASE.finditer(source, start, end))
    assert len(cases) > 30, "render's cases were not found"
    copies = {}
    for n, case in enumerate(cases):
        stop = cases[n + 1].start() if n + 1 < len(cases) else end
        copies[case.group(1)] = source[: case.start()] + source[stop:]
    return copies


def _mypy(*files: Path) -> str:
    # a cache of its own: the copies are top-level modules named alike in every run, and
    # the project's cache answered for one of them from an earlier run's file
    cache = files[0].parent / ".mypy_cache"
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(cache)]
        + [str(f) for f in files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run.stdout + run.stderr


def test_mypy_rejects_the_renderer_missing_any_case(tmp_path: Path) -> None:
    source = Path(journal_text.__file__).read_text()
    copies = _without_each_case(source)
    files = {}
    for n, (case, text) in enumerate(copies.items()):
        path = tmp_path / f"without_case_{n}.py"
        path.write_text(text)
        files[case] = path
    (tmp_path / "as_is.py").write_text(source)
    report = _mypy(tmp_path / "as_is.py", *files.values())
    assert "as_is.py" not in report, report
    for case, path in files.items():
        errors = [line for line in report.splitlines() if line.startswith(str(path))]
        assert any('"assert_never"' in line for line in errors), (case, report)
