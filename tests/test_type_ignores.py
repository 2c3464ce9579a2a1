"""Every ``type: ignore`` names its error code and says why (STYLE: a silenced check
carries its reason), in the code and the tests alike."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (
    "store",
    "broker",
    "producer",
    "rqface",
    "declaration",
    "worker",
    "ops",
    "runtime",
    "runfleet",
    "tests",
    "scripts",
)
IGNORE = re.compile(r"#\s*type:\s*ignore")
WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z0-9_,\- ]+\]\s+#\s*\S")


def _comments(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def test_every_type_ignore_says_why() -> None:
    bare = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if p != ROOT):
                continue  # runfleet/store etc. are the folders themselves
            lines = path.read_text().split("\n")
            for number, _comment in _comments(path):
                line = lines[number - 1]
                if IGNORE.search(line) and not WITH_REASON.search(line):
                    bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "type: ignore without a reason:\n" + "\n".join(bare)
