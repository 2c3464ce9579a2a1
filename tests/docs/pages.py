"""The code blocks of a docs page, as written, and how a test runs them in order.

A page marks what its blocks are with an HTML comment on the line before the fence, which
no reader sees (GitHub and mkdocs render nothing for it):

- ``<!-- test: run -->``: a shell block; each command runs in order and must exit 0.
- ``<!-- test: start -->``: a shell block of long-running commands (a worker), each
  started in the background and stopped when the page is done.
- ``<!-- test: file PATH -->``: the block is the file PATH of the reader's folder. A
  Python block whose first line names its file (``# shop.py``, ``# app/images.py``) is
  one without a marker.
- ``<!-- test: skip REASON -->``: not run, and the reason says why (a side-by-side with
  another library, a pid only the reader knows, a Docker engine).

``, production only`` or ``, embedded only`` after the action restricts a block to one of
the two ways a page is run: with the servers' URLs set (production), or with no URL and a
fresh HOME (the embedded pair). A shell or Python block with none of these is an error
naming its line: a block added later is run or skipped on purpose, never by accident.

Commands run as a reader's shell would run them, with four stand-ins: ``pip install``
checks that what it names is installed here and, for the checkout, that each extra
exists (a venv per run would cost minutes); ``python -m venv`` and ``source``/``.`` are
the test session's Python; ``export RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL`` set the
harness's servers, never the page's example (the machine's own servers stay untouched);
``PYTHONPATH=.`` also keeps the checkout under test importable. A ``print(...)  # text``
line of a page's file is a promise: running that file must print ``text``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
Mode = Literal["production", "embedded"]
Action = Literal["run", "start", "file", "skip"]

RUNNABLE = {"python", "py", "sh", "bash", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"^<!--\s*test:\s*(run|start|file|skip)\b\s*(.*?)\s*-->\s*$")
FILE_LINE = re.compile(r"^#\s*([\w./-]+\.py)\s*$")
PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s*(.+?)\s*$", re.MULTILINE)
URL_VARS = ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL")
COMMAND_TIMEOUT_S = 100


class Unmarked(AssertionError):
    """A runnable block that says neither how it runs nor why it does not."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    action: Action
    arg: str = ""
    only: Mode | None = None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every shell and Python block of ``page`` with what its marker says; raises
    ``Unmarked`` for a runnable block that has none."""
    text = page.read_text()
    found: list[Block] = []
    for fence in FENCE.finditer(text):
        lang = fence[1].lower()
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.match(before)
        body = fence[2]
        if mark is not None:
            action: Action = mark[1]  # type: ignore[assignment]  # MARK matches only these
            rest = mark[2]
            only: Mode | None = None
            modes: tuple[Mode, ...] = ("production", "embedded")
            for mode in modes:
                if re.search(rf",\s*{mode} only$", rest):
                    only = mode
                    rest = re.sub(rf",?\s*{mode} only$", "", rest).strip()
            found.append(Block(page, line, lang, body, action, rest, only))
        elif lang in RUNNABLE:
            first = body.split("\n", 1)[0]
            named = FILE_LINE.match(first) if lang in ("python", "py") else None
            if named is None:
                raise Unmarked(
                    f"{page.relative_to(ROOT)}:{line}: a {lang} block with no "
                    "<!-- test: run|start|file PATH|skip REASON --> before it "
                    "(tests/docs/pages.py)"
                )
            found.append(Block(page, line, lang, body, "file", named[1]))
    return found


@dataclass
class Reader:
    """A reader following one page in a fresh folder: files written, commands run."""

    folder: Path
    env: dict[str, str]
    mode: Mode
    urls: dict[str, str]
    log: list[str] = field(default_factory=list)
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def follow(self, page: Path) -> None:
        for block in blocks(page):
            if block.action == "skip" or block.only not in (None, self.mode):
                continue
            match block.action:
                case "file":
                    target = self.folder / block.arg
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(block.body)
                case "run":
                    for command in _commands(block.body):
                        self._run(block, command)
                case "start":
                    for command in _commands(block.body):
                        self._start(block, command)

    def close(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run(
            [sys.executable, "-m", "runfleet.ops", "dev", "stop"],
            env=self.env, cwd=self.folder, capture_output=True, timeout=120,
        )  # fmt: skip

    def _run(self, block: Block, command: str) -> None:
        words = shlex.split(command)
        if words[:3] == ["python", "-m", "venv"] or words[0] in (".", "source"):
            return
        if words[:2] == ["pip", "install"]:
            _installed(block, [w for w in words[2:] if not w.startswith("-")])
            return
        if words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = self.urls[name] if name in URL_VARS else value
            return
        done = subprocess.run(
            ["bash", "-c", _keep_checkout(command)], cwd=self.folder, env=self.env,
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
        )  # fmt: skip
        self.log.append(f"$ {command}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, f"{block}: `{command}` exited {done.returncode}:\n" + (
            done.stdout + done.stderr
        )
        script = self.folder / words[1] if words[0] == "python" and len(words) > 1 else None
        if script is not None and script.suffix == ".py" and script.exists():
            for promise in PROMISE.finditer(script.read_text()):
                assert promise[1] in done.stdout, (
                    f"{block}: `{command}` promised {promise[1]!r}, printed:\n{done.stdout}"
                )

    def _start(self, block: Block, command: str) -> None:
        out = (self.folder / f"started-{len(self.background)}.log").open("wb")
        self.background.append(
            subprocess.Popen(
                ["bash", "-c", _keep_checkout(command)],
                cwd=self.folder,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        self.log.append(f"$ {command} &   ({block})")


def _commands(body: str) -> list[str]:
    """The block's commands: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [c for c in (_uncomment(line).strip() for line in joined.splitlines()) if c]


def _uncomment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` after a blank, outside quotes)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _keep_checkout(command: str) -> str:
    """``PYTHONPATH=X cmd`` as ``PYTHONPATH=X:<checkout> cmd``: the reader's PYTHONPATH
    must not hide the runfleet under test behind an installed one."""
    return re.sub(r"^PYTHONPATH=(\S+)", rf"PYTHONPATH=\1:{ROOT}", command)


def _installed(block: Block, requirements: list[str]) -> None:
    """What ``pip install`` names is here: the checkout with each extra it asks for, or a
    distribution of that name. ``runfleet`` by name is not on the package index."""
    extras_of = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for requirement in requirements:
        where, _, extras = requirement.partition("[")
        if where == "." or "/" in where:
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert extra in extras_of, f"{block}: pyproject.toml has no extra {extra!r}"
                for needed in extras_of[extra]:
                    name = re.split(r"[<>=!;\[ ]", needed, maxsplit=1)[0]
                    importlib.metadata.distribution(name)  # raises if absent
            continue
        assert where != "runfleet", f"{block}: runfleet is not on the package index"
        importlib.metadata.distribution(where)
