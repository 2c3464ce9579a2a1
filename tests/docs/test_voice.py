"""Comments and docstrings speak in the project's own voice: what the code does and why,
now. No issue numbers, branch names or first person; the account of how a change came
about belongs in its commit message.

Every tracked Python file's comments and string statements (module, class and function
docstrings, and the docstrings of names) are read; string values the code uses are not.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

from tests.docs.pages import ROOT

PROCESS_WORDS = re.compile(
    r"\bissues? #?\d+\b"  # an issue by its number
    r"|\bbranch [a-z][\w-]*\d"  # a branch by its name
    r"|\bsuperseded\b|\bCEO\b|\breviewers?\b"
    r"|\b[Ww]e\b|\b[Oo]ur\b"
)


def _python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name]


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and string statements of ``source``, each with its line."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                found.append((node.lineno, node.value.value))
    return found


def test_prose_reads_comments_and_docstrings_not_values() -> None:
    source = '"""Module, issue 7."""\nX = "issue 8"  # issue 9\n"""X: issue 10."""\n'
    assert [PROCESS_WORDS.findall(text) for _, text in prose(source)] == [
        ["issue 9"],
        ["issue 7"],
        ["issue 10"],
    ]


def test_no_process_words_in_comments_or_docstrings() -> None:
    files = _python_files()
    assert len(files) > 100, "git ls-files listed no Python files"
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {found[0]!r}"
        for path in files
        for line, text in prose(path.read_text())
        for found in PROCESS_WORDS.finditer(text)
    ]
    assert hits == [], "\n".join(hits)
