#!/usr/bin/env python3
"""Move a runfleet tree's references into the ``runfleet.*`` namespace (a repo tool).

    python scripts/namespace.py [TREE]        # rewrite TREE (default: the current directory)
    python scripts/namespace.py --check TREE  # exit 1 and list the files it would change

The repository keeps its top-level ``store/``, ``broker/``, ``worker/`` and ``ops/`` folders;
the wheel maps them to ``runfleet.store`` etc., and the code imports itself the way users
do. This script is the mechanical half of that move, written so that it can be replayed on
any branch that still uses the old imports (the lead runs it on each branch before merging
it): the same input gives the same output, and a second run changes nothing.

What it rewrites, in every file git tracks (or would track) under TREE:

- Python imports: ``import store.x [as y]``, ``from worker.y import z``, ``from ops import w``
  become ``runfleet.``-prefixed; a bare ``import broker`` becomes ``from runfleet import
  broker``; ``import broker.streams`` (no alias, binds ``broker``) becomes ``import
  runfleet.broker.streams`` and the file's code names ``broker`` become ``runfleet.broker``.
  Relative imports need nothing: ``runfleet.worker``'s ``from ..store`` is ``runfleet.store``.
- Module paths in Python string literals (not comments or docstrings: prose may say
  ``store.values``, and a longer line there would break the lint), and in Makefile, TOML,
  YAML, Dockerfile, shell and Markdown text: ``"worker.driver.X"`` (mock and monkeypatch targets),
  ``"ops.cli.app:app"``, ``--flows ops.demo.flows``. Only a dotted name whose first two parts
  name a real module or package of TREE (``worker/driver.py``, ``ops/demo/``) or a name the
  package's ``__init__`` defines counts: log events such as ``worker.started`` stay.
- A bare package name where it can only be a module: after ``-m`` (``python -m ops``,
  ``[sys.executable, "-m", "ops", ...]``) and as ``resources.files("store")``.
- pyproject.toml: ``[tool.mypy] packages`` lists ``runfleet`` instead of the four packages,
  ``[tool.setuptools.package-data]`` keys and ``packages.find`` patterns are ``runfleet.*``.
- Markdown code: ``from broker import Queue`` lines as for Python.

Then, if ruff is on PATH or beside this interpreter, it re-sorts the imports of the Python
files it changed (``ruff check --select I --fix``, ``runfleet`` first-party) so that the
lint stays clean. Paths such as ``store/runs.py`` never change: the folders stay.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

TOPS = ("store", "broker", "worker", "ops", "runtime")
PREFIX = "runfleet"
TEXT_SUFFIXES = {".toml", ".yaml", ".yml", ".md", ".cfg", ".ini", ".sh", ".txt"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}
SKIP_PARTS = {".git", ".venv", "build", "site", "mutants", "node_modules", "__pycache__"}
# This script and its test hold the old names on purpose (patterns, fixtures).
SELF = {Path("scripts") / "namespace.py", Path("tests") / "test_namespace_script.py"}
LINE_LENGTH = 100  # [tool.ruff] line-length


class Unsupported(Exception):
    """A form this script will not guess at: the message names the file and line."""


class Modules:
    """Which dotted names of TREE are runfleet's: modules, packages and package exports."""

    def __init__(self, tree: Path) -> None:
        self.known: set[str] = set()
        for top in TOPS:
            base = tree / top
            if not base.is_dir():
                continue
            self.known.add(top)
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(tree)
                if any(part in SKIP_PARTS for part in rel.parts):
                    continue
                if path.is_dir() and any(path.glob("*.py")):
                    self.known.add(".".join(rel.parts))
                elif path.suffix == ".py":
                    parts = rel.with_suffix("").parts
                    if parts[-1] == "__init__":
                        self.exports(path, ".".join(parts[:-1]))
                    else:
                        self.known.add(".".join(parts))

    def exports(self, init: Path, package: str) -> None:
        """Top-level names a package's ``__init__`` binds (``broker.Queue``)."""
        try:
            module = ast.parse(init.read_text())
        except SyntaxError:
            return
        for node in module.body:
            names: list[str] = []
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            self.known.update(f"{package}.{n}" for n in names if n != "*")

    def ours(self, dotted: str) -> bool:
        """``worker.driver.X`` is ours if ``worker.driver`` is (two parts decide)."""
        parts = dotted.split(".")
        return ".".join(parts[:2]) in self.known


_TOP = "|".join(TOPS)
# A dotted name starting with a top package, not itself part of a longer name or a path.
DOTTED = re.compile(rf"(?<![\w.\-/$@])(?:{_TOP})(?:\.[A-Za-z_]\w*)+")
DASH_M = re.compile(rf"(?<![\w-])(-m\s+)({_TOP})(?![\w.\-/])")
_LEAD = r"^(\s*(?:>>>\s+|\.\.\.\s+)?"  # a code line, or a doctest's
MD_FROM = re.compile(rf"{_LEAD}from\s+)({_TOP})(?=[\s.])", re.MULTILINE)
MD_IMPORT = re.compile(rf"{_LEAD})import\s+({_TOP})(?=\s*(?:#|$))", re.MULTILINE)
MD_IMPORT_DOTTED = re.compile(rf"{_LEAD}import\s+)({_TOP})(?=\.\w)", re.MULTILINE)


def rewrite_dotted(text: str, modules: Modules) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match[0]
        return f"{PREFIX}.{name}" if modules.ours(name) else name

    return DOTTED.sub(sub, text)


def rewrite_text(text: str, modules: Modules, markdown: bool) -> str:
    if markdown:
        text = MD_FROM.sub(lambda m: f"{m[1]}{PREFIX}.{m[2]}", text)
        text = MD_IMPORT.sub(lambda m: f"{m[1]}from {PREFIX} import {m[2]}", text)
        text = MD_IMPORT_DOTTED.sub(lambda m: f"{m[1]}{PREFIX}.{m[2]}", text)
    text = DASH_M.sub(lambda m: f"{m[1]}{PREFIX}.{m[2]}", text)
    return rewrite_dotted(text, modules)


def rewrite_pyproject(text: str) -> str:
    """The three pyproject entries that name the packages themselves."""

    def mypy_packages(match: re.Match[str]) -> str:
        items = re.findall(r'"([^"]+)"', match[2])
        if not any(item in TOPS for item in items):
            return match[0]
        out: list[str] = []
        for item in items:
            item = PREFIX if item in TOPS else item
            if item not in out:
                out.append(item)
        return match[1] + ", ".join(f'"{i}"' for i in out) + "]"

    text = re.sub(r"(?m)^(packages\s*=\s*\[)([^\]]*)\]", mypy_packages, text)
    text = re.sub(rf"(?m)^({_TOP})(\s*=\s*\[)", rf'"{PREFIX}.\1"\2', text)

    def find_include(match: re.Match[str]) -> str:
        items = re.findall(r'"([^"]+)"', match[2])
        if not any(item.rstrip("*") in TOPS for item in items):
            return match[0]
        out: list[str] = []
        for item in items:
            item = f"{PREFIX}*" if item.rstrip("*") in TOPS else item
            if item not in out:
                out.append(item)
        return match[1] + ", ".join(f'"{i}"' for i in out) + "]"

    return re.sub(r"(?m)^(include\s*=\s*\[)([^\]]*)\]", find_include, text)


class PythonFile:
    """Token-level edits of one Python source (comments, strings and layout survive)."""

    def __init__(self, path: Path, source: str, modules: Modules) -> None:
        self.path = path
        self.source = source
        self.modules = modules
        self.lines = source.splitlines(keepends=True)
        self.edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
        self.bound_tops: set[str] = set()
        self.bare: list[tuple[int, str]] = []  # (index in edits, top) of each `import top`

    def rewrite(self) -> str:
        tokens = list(tokenize.generate_tokens(io.StringIO(self.source).readline))
        self.imports(tokens)
        for index, top in self.bare:
            if top in self.bound_tops:  # `import broker` beside `import broker.streams`:
                start, end, _ = self.edits[index]  # the names say runfleet.broker now
                self.edits[index] = (start, end, f"import {PREFIX}.{top}")
        self.strings(tokens)
        if self.bound_tops:
            self.names(tokens)
        return self.apply()

    def where(self, tok: tokenize.TokenInfo) -> str:
        return f"{self.path}:{tok.start[0]}"

    def imports(self, tokens: list[tokenize.TokenInfo]) -> None:
        significant = [t for t in tokens if t.type not in (tokenize.NL, tokenize.COMMENT)]
        starts = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
        for i, tok in enumerate(significant):
            if tok.type != tokenize.NAME or tok.string not in ("from", "import"):
                continue
            before = significant[i - 1] if i else None
            if before is not None and not (
                before.type in starts or (before.type == tokenize.OP and before.string == ";")
            ):
                continue  # `from` inside `raise X from Y`, or the `import` of `from a import`
            if tok.string == "from":
                first = significant[i + 1]
                if first.type == tokenize.NAME and first.string in TOPS:
                    self.edits.append((first.start, first.start, f"{PREFIX}."))
            else:
                self.plain_import(significant, i + 1)

    def plain_import(self, tokens: list[tokenize.TokenInfo], i: int) -> None:
        """``import a.b as c, d``: each dotted name, with its alias if any."""
        while True:
            first = tokens[i]
            j = i + 1
            while tokens[j].string == "." and tokens[j + 1].type == tokenize.NAME:
                j += 2
            dotted = first.string != "" and first.string in TOPS
            alias = tokens[j].type == tokenize.NAME and tokens[j].string == "as"
            if dotted:
                if j == i + 1 and not alias:  # import broker
                    self.edits.append((first.start, first.end, f"{PREFIX}.{first.string}"))
                    self.whole_bare(tokens, i, first)
                elif alias:  # import worker.lease as lease_module
                    self.edits.append((first.start, first.start, f"{PREFIX}."))
                else:  # import broker.streams: binds `broker`, used as broker.streams.X
                    self.edits.append((first.start, first.start, f"{PREFIX}."))
                    self.bound_tops.add(first.string)
            if alias:
                j += 2
            if tokens[j].string != ",":
                return
            i = j + 1

    def whole_bare(
        self, tokens: list[tokenize.TokenInfo], i: int, first: tokenize.TokenInfo
    ) -> None:
        """``import broker`` alone on its statement -> ``from runfleet import broker``."""
        keyword = tokens[i - 1]
        after = tokens[i + 1]
        if after.type != tokenize.NEWLINE:
            raise Unsupported(f"{self.where(first)}: `import {first.string}, ...`: split it")
        self.edits.pop()
        self.bare.append((len(self.edits), first.string))
        self.edits.append((keyword.start, first.end, f"from {PREFIX} import {first.string}"))

    def strings(self, tokens: list[tokenize.TokenInfo]) -> None:
        statement = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
        code = [t for t in tokens if t.type not in (tokenize.NL, tokenize.COMMENT)]
        prose = {  # docstrings and bare string statements: prose, like comments
            tok.start
            for i, tok in enumerate(code)
            if tok.type == tokenize.STRING
            and (i == 0 or code[i - 1].type in statement)
            and i + 1 < len(code)
            and code[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER)
        }
        significant = [t for t in tokens if t.type not in (tokenize.NL, tokenize.NEWLINE)]
        for i, tok in enumerate(significant):
            if tok.type == tokenize.STRING and tok.start not in prose:
                new = rewrite_dotted(tok.string, self.modules)
                new = DASH_M.sub(lambda m: f"{m[1]}{PREFIX}.{m[2]}", new)
                body = re.fullmatch(rf"([rbuRBU]*)(['\"])({_TOP})\2", tok.string)
                if body and self.module_position(significant, i):
                    new = f"{body[1]}{body[2]}{PREFIX}.{body[3]}{body[2]}"
            else:
                continue
            if new != tok.string:
                self.edits.append((tok.start, tok.end, new))

    @staticmethod
    def module_position(tokens: list[tokenize.TokenInfo], i: int) -> bool:
        """A bare ``"ops"`` right after ``"-m",`` or as ``files("store")``."""
        prev = [t for t in tokens[max(0, i - 3) : i] if t.type != tokenize.COMMENT]
        if len(prev) >= 2 and prev[-1].string == "," and prev[-2].type == tokenize.STRING:
            return prev[-2].string.strip("'\"") == "-m"
        return len(prev) >= 2 and prev[-1].string == "(" and prev[-2].string == "files"

    def names(self, tokens: list[tokenize.TokenInfo]) -> None:
        """Code references to a top bound by ``import top.sub`` become ``runfleet.top``."""
        tree = ast.parse(self.source)
        for node in ast.walk(tree):
            bound: list[str] = []
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound = [node.id]
            elif isinstance(node, ast.arg):
                bound = [node.arg]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound = [node.name]
            elif isinstance(node, ast.ImportFrom):
                bound = [a.asname or a.name for a in node.names]
            if clash := self.bound_tops.intersection(bound):
                raise Unsupported(
                    f"{self.path}:{getattr(node, 'lineno', '?')}: {sorted(clash)} is both "
                    "`import top.sub` and another name here: rewrite this file by hand"
                )
        loads = {
            (n.lineno, n.col_offset)
            for n in ast.walk(tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in self.bound_tops
        }
        for tok in tokens:
            if tok.type == tokenize.NAME and tok.start in loads:
                self.edits.append((tok.start, tok.start, f"{PREFIX}."))

    def offset(self, position: tuple[int, int]) -> int:
        row, col = position
        return sum(len(line) for line in self.lines[: row - 1]) + col

    def apply(self) -> str:
        text = self.source
        for start, end, new in sorted(self.edits, key=lambda e: self.offset(e[0]), reverse=True):
            a, b = self.offset(start), self.offset(end)
            text = text[:a] + new + text[b:]
        return text


def files(tree: Path) -> Iterable[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=tree,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in sorted(set(filter(None, listed.split("\0")))):
        rel = Path(name)
        path = tree / rel
        if rel in SELF or any(part in SKIP_PARTS for part in rel.parts):
            continue
        if path.is_symlink() or not path.is_file():
            continue
        if rel.suffix == ".py" or rel.suffix in TEXT_SUFFIXES or rel.name in TEXT_NAMES:
            yield rel


def rewrite_file(tree: Path, rel: Path, modules: Modules) -> str | None:
    """The new text of one file, or None when it stays as it is."""
    path = tree / rel
    try:
        old = path.read_text()
    except UnicodeDecodeError:
        return None
    if rel.suffix == ".py":
        new = PythonFile(rel, old, modules).rewrite()
    else:
        new = rewrite_text(old, modules, markdown=rel.suffix == ".md")
        if rel.name == "pyproject.toml":
            new = rewrite_pyproject(new)
    return None if new == old else new


def ruff() -> str | None:
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.exists() else shutil.which("ruff")


def sort_imports(tree: Path, changed: list[Path]) -> None:
    """Re-sort the changed files' imports: runfleet is first-party on every branch."""
    python = [str(p) for p in changed if p.suffix == ".py"]
    exe = ruff()
    if not python or exe is None:
        return
    subprocess.run(
        [
            exe,
            "check",
            "--quiet",
            "--select",
            "I",
            "--fix",
            "--exit-zero",
            "--config",
            f"lint.isort.known-first-party = ['{PREFIX}', 'tests']",
            *python,
        ],
        cwd=tree,
        check=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", default=".", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    tree: Path = args.tree.resolve()
    modules = Modules(tree)
    if not modules.known:
        print(f"{tree}: none of {', '.join(TOPS)}/ here", file=sys.stderr)
        return 2
    changed: list[Path] = []
    try:
        rewritten = {rel: rewrite_file(tree, rel, modules) for rel in files(tree)}
    except Unsupported as exc:
        print(f"namespace.py: {exc}", file=sys.stderr)
        return 2
    for rel, new in rewritten.items():
        if new is None:
            continue
        changed.append(rel)
        if not args.check:
            (tree / rel).write_text(new)
    if args.check:
        for rel in changed:
            print(rel)
        return 1 if changed else 0
    sort_imports(tree, changed)
    print(f"namespace.py: {len(changed)} files rewritten under {tree}")
    for rel in (p for p in changed if p.suffix == ".py"):  # the lint: rewrap these by hand
        for number, line in enumerate((tree / rel).read_text().splitlines(), 1):
            if len(line) > LINE_LENGTH and PREFIX in line:
                print(f"  {rel}:{number}: longer than {LINE_LENGTH} characters now")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
