"""The README stays a short introduction whose every link leads somewhere.

The manual is the docs site; the README is what a visitor reads first: at most 15 KB,
the two commands (and CI runs the same test command), and only links that resolve.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LIMIT = 15 * 1024
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's and mkdocs' anchor of a heading: lower case, punctuation dropped, dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_the_readme_is_at_most_15_kb() -> None:
    assert len(README.read_bytes()) <= LIMIT, f"README.md is {len(README.read_bytes())} bytes"


def test_every_readme_link_resolves() -> None:
    links = LINK.findall(README.read_text())
    assert links, "the README links into the docs"
    for link in links:
        if re.match(r"https?://", link):
            continue  # no network here; the site's own pages are all relative
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve() if target else README
        assert path.is_relative_to(ROOT) and path.exists(), f"{link}: no such file"
        if anchor:
            assert path.suffix == ".md" and anchor in _anchors(path), f"{link}: no such heading"


def test_ci_runs_the_readmes_test_command() -> None:
    text = README.read_text()
    block = text.split("## The two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec make test$", ci, re.MULTILINE), ".ci/run must run `make test`"
