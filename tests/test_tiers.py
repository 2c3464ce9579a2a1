"""The tier tables name tests that exist, mark them by place, and the Makefile obeys them.

A renamed or moved test would silently leave the serial pass (and run beside three busy
workers) or the fast tier's exclusions: every entry must still name a file, folder or
test function of the checkout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support import tiers

ROOT = Path(__file__).resolve().parents[1]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _missing(entry: str) -> str | None:
    place, _, test = entry.partition("::")
    path = ROOT / place
    if place.endswith("/"):
        return None if path.is_dir() and any(path.glob("test_*.py")) else "no test folder"
    if not path.is_file():
        return "no such file"
    if test and test not in _functions(path):
        return f"no test {test}"
    return None


def test_every_entry_names_a_test_of_the_checkout() -> None:
    entries = [*tiers.SERIAL, *tiers.HEAVY_FIRST, *(p for ps in tiers.TIERS.values() for p in ps)]
    wrong = {e: why for e in entries if (why := _missing(e)) is not None}
    assert wrong == {}


def test_markers_by_place() -> None:
    rate = "tests/queues/test_rate_limit.py::test_three_workers_hold_the_rate_within_five_percent"
    assert tiers.markers_for(rate) == {"serial"}
    assert tiers.markers_for("tests/queues/test_rate_limit.py::test_the_cli_shows_it") == set()
    assert tiers.markers_for("tests/ha/test_failover.py::test_x[sync]") == {"ha", "serial"}
    assert tiers.markers_for("tests/partition/test_partitions.py::test_full_partition") == {
        "partition",
        "serial",
    }
    assert tiers.markers_for("tests/bench/test_peers_smoke.py::test_flows_bench_against_dbos") == {
        "bench"
    }
    assert tiers.markers_for("tests/chaos/test_producers.py::test_sync[a]") == {"serial"}
    # A prefix is a whole name: another test that starts with the same words is not it.
    waits = "tests/flows/test_waits.py::test_long_sleep_parks_on_a_durable_clock"
    assert tiers.markers_for(waits) == {"serial"}
    assert tiers.markers_for(f"{waits}[param]") == {"serial"}
    assert tiers.markers_for(f"{waits}_twice") == set()
    assert tiers.markers_for("tests/hardly/test_x.py::test_y") == set()


def test_heavy_modules_go_first_and_the_rest_keep_their_order() -> None:
    ids = [
        "tests/broker/test_codec.py::test_a",
        "tests/bench/test_peers_smoke.py::test_b",
        "tests/broker/test_codec.py::test_c",
        "tests/chaos/test_backlog_chaos.py::test_d",
    ]
    assert sorted(ids, key=tiers.heavy_rank) == [ids[3], ids[1], ids[0], ids[2]]


def test_the_makefile_runs_both_passes_and_the_fast_tier_from_the_tables() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None
    lines = recipe[1]
    assert '$(PARALLEL) -m "not serial"' in lines and "-q -m serial" in lines
    # Both passes always run, and either one failing fails `make test`.
    passes = [line for line in lines.splitlines() if "/pytest " in line]
    assert len(passes) == 2 and all(line.endswith("|| status=$$?; \\") for line in passes)
    assert lines.rstrip().endswith("exit $$status")
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert fast is not None
    assert f'-m "{tiers.fast_expression()}"' in fast[1]
