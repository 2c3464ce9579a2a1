"""The docs hold what a reader needs and no lab notes; every page is in the navigation; the
built site loads nothing from the network.

A figure carries the command, the machine and the settings behind it, nothing else: no
commit measured, no account of what else was running on the machine that day.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LAB_NOTES = [
    re.compile(r"\bcommit \(?[0-9a-f]{7,40}\b"),
    re.compile(r"\((?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7}\)"),  # (c216ac8)
    re.compile(r"other agents|later session|same day|shared the machine|sharing both cores"),
    re.compile(r"\bat (?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),  # main at d16a3b0
    re.compile(
        r"other engineers|engineers'|shared by \w+ engineers|this session|(of|in) the session\b"
        r"|quietest minutes|while other (work|test suites|suites) ran"
        r"|shared (\d-core )?(box|machine)|box shared"
    ),
]


def _pages() -> list[Path]:
    return sorted([ROOT / "README.md", *DOCS.rglob("*.md")])


def test_no_lab_notes_in_the_docs() -> None:
    for page in _pages():
        text = page.read_text()
        for pattern in LAB_NOTES:
            found = pattern.search(text)
            assert found is None, f"{page.relative_to(ROOT)}: lab note {found[0]!r}"


def _nav(entries: list[object]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found |= _nav(value)
        elif isinstance(value, str):
            found.add(value)
    return found


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "pages mkdocs.yml's nav does not list"
    assert nav - pages == set(), "nav entries without a page"


# What a page needs to render, fetched from another host: a script, a stylesheet, a font, an
# image or a frame (plain links to other sites are not loads).
NETWORK_LOADS = [
    re.compile(r"""<(?:script|img|iframe|source|link)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//"""),
    re.compile(r"""url\(\s*["']?(?:https?:)?//|@import\s+(?:url\()?["']?(?:https?:)?//"""),
]


SECTION_FOLDERS = {
    "Tutorial": "tutorial",
    "How-to guides": "how-to",
    "Reference": "reference",
    "Explanation": "explanation",
    "Development": "development",
}
"""The folder under docs/ of each top-level section of the navigation."""


def test_every_page_sits_in_the_folder_its_section_names() -> None:
    """A page listed under a section of mkdocs.yml's nav lives in that section's folder;
    only the home page is at the top of docs/."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    misplaced = []
    for entry in config["nav"]:
        section, value = next(iter(entry.items()))
        if value == "index.md":
            continue
        assert section in SECTION_FOLDERS, f"nav section {section!r} names no folder"
        pages = _nav([entry])
        misplaced += [p for p in pages if not p.startswith(SECTION_FOLDERS[section] + "/")]
    assert misplaced == [], "pages outside their section's folder"


PAGE_LIMIT = 40 * 1024
"""A page longer than this is a log, not a page: cut it to what is current."""


def test_no_page_is_over_40_kb() -> None:
    sizes = {str(p.relative_to(ROOT)): p.stat().st_size for p in _pages()}
    assert {page: size for page, size in sizes.items() if size > PAGE_LIMIT} == {}


def test_the_built_site_loads_nothing_from_the_network(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=600,
    )
    pages = [p for p in site.rglob("*") if p.suffix in (".html", ".css")]
    assert len([p for p in pages if p.suffix == ".html"]) >= len(list(DOCS.rglob("*.md")))
    for page in pages:
        text = page.read_text(errors="replace")
        for pattern in NETWORK_LOADS:
            found = pattern.search(text)
            assert found is None, f"{page.relative_to(site)} loads {found[0]!r}"


def _make_docs_arguments() -> list[str]:
    """The arguments the Makefile's `docs` target passes to `mkdocs build`."""
    recipe = re.search(r"^docs:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, "the Makefile has no docs target"
    command = recipe[1].split()
    return command[command.index("build") + 1 :]


def test_the_docs_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """`make docs` (and so `make test`) fails when a page links to a page that is not there.

    The same flags and the same validation settings as the project's, on a one-page site:
    a flag that hides the warnings `--strict` counts (`--quiet`) makes this fail.
    """
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [a page](missing.md).\n")
    site_config = {"site_name": "probe", "validation": config["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(site_config))
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *_make_docs_arguments(), "-d", "site"],
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode != 0, built.stderr
    assert "missing.md" in built.stderr
