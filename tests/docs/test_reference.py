"""The reference pages list exactly what the code has: settings, metrics, log events, commands.

Operators build dashboards, log queries and deployments from those tables (docs/reference/),
so a setting, metric, log event or command added without documentation (or documented but
gone) fails here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from prometheus_client import Counter, Gauge, Histogram

from runfleet.broker import hostile
from runfleet.ops.cli.app import app
from runfleet.store.config import Settings
from runfleet.worker import metrics

ROOT = Path(__file__).resolve().parents[2]
_LEVELS = {"debug", "info", "warning", "error", "exception"}


REFERENCE = ROOT / "docs" / "reference"


def _page(name: str) -> str:
    return (REFERENCE / f"{name}.md").read_text()


def _rows(section: str) -> dict[str, list[str]]:
    """First-column names (every backquoted name in it) -> the row's other cells."""
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells[1:]
    return rows


def _metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for value in [*vars(metrics).values(), *vars(hostile).values()]:
        if isinstance(value, Counter | Gauge | Histogram):
            (family,) = value.describe()
            name = family.name + ("_total" if family.type == "counter" else "")
            # prometheus_client keeps label names private; tests may read them.
            found[name] = (family.type, tuple(value._labelnames))
    return found


def test_metric_names_follow_prometheus_conventions() -> None:
    for name, (kind, labels) in _metrics().items():
        assert re.fullmatch(r"runfleet_[a-z_]+", name), name
        assert name.endswith("_total") == (kind == "counter"), name
        if kind == "histogram" and ("duration" in name or "latency" in name):
            assert name.endswith("_seconds"), name
        assert all(re.fullmatch(r"[a-z_]+", label) for label in labels), (name, labels)


def test_the_metrics_page_lists_every_metric_with_its_labels() -> None:
    documented = _rows(_page("metrics"))
    emitted = _metrics()
    assert set(documented) == set(emitted)
    for name, (kind, labels) in emitted.items():
        doc_kind, doc_labels = documented[name][0], documented[name][1]
        assert doc_kind == kind, name
        assert set(re.findall(r"`([^`]+)`", doc_labels)) == set(labels), name


def _log_events() -> set[str]:
    events: set[str] = set()
    for folder in (
        "worker",
        "rqface",
        "producer",
        "declaration",
        "broker",
        "store",
        "ops",
        "runtime",
    ):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                target = node.func.value
                if (
                    isinstance(target, ast.Name)
                    and target.id == "hostile"
                    and node.func.attr in ("dropped", "error_reply")
                    and len(node.args) > 2
                    and isinstance(node.args[2], ast.Constant)
                ):  # broker.hostile's rate-limited helpers: (log, channel, "event", ...)
                    events.add(str(node.args[2].value))
                    continue
                if node.func.attr not in _LEVELS or not isinstance(target, ast.Name):
                    continue
                if target.id != "log" or not node.args:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    events.add(first.value)
    # broker/notify.py passes its event names through a variable: the literal names.
    source = (ROOT / "broker" / "notify.py").read_text()
    events |= set(re.findall(r'"(notify\.[a-z_]+_failed)"', source))
    return events


def test_the_logs_page_lists_every_log_event() -> None:
    documented = set(_rows(_page("logs")))
    emitted = _log_events()
    assert emitted - documented == set(), "undocumented log events"
    assert documented - emitted == set(), "documented events nothing emits"


def test_the_settings_page_lists_every_setting() -> None:
    documented = {name for name in _rows(_page("settings")) if name.startswith("RUNFLEET_")}
    prefix = Settings.model_config.get("env_prefix", "")
    fields = {f"{prefix}{name}".upper() for name in Settings.model_fields}
    assert fields - documented == set(), "undocumented settings"
    assert documented - fields == set(), "documented settings that do not exist"


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of a click group (typer builds on its own copy of click)."""
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not sub.hidden:
            yield (*path, name)
            yield from _commands(sub, (*path, name))


def test_the_cli_page_lists_every_command() -> None:
    text = _page("cli")
    documented = set(re.findall(r"`runfleet ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)*)", text))
    commands = {" ".join(path) for path in _commands(typer.main.get_command(app))}
    groups = {c for c in commands if any(other.startswith(c + " ") for other in commands)}
    missing = {
        c for c in commands - groups if not any(d == c or d.startswith(c + " ") for d in documented)
    }
    assert missing == set(), "commands the CLI page does not list"
    # Every documented `runfleet X Y` starts with a real command.
    unknown = {d for d in documented if not any(d == c or d.startswith(c + " ") for c in commands)}
    assert unknown == set(), "documented commands that do not exist"


def test_journal_page_lists_every_kind_with_its_payload_fields() -> None:
    """docs/reference/journal.md: a row per ``Kind``, naming its payload type and exactly
    the JSON fields that type stores (``?`` marking those left out when absent)."""
    import dataclasses

    from runfleet.store.journal_records import PAYLOADS

    section = _page("journal").split("## Kinds and their payload fields")[1].split("\n## ")[0]
    rows = _rows(section)
    assert set(rows) == {kind.value for kind in PAYLOADS}, "kinds documented != Kind"
    for kind, cls in PAYLOADS.items():
        type_cell, fields_cell = rows[kind.value][0], rows[kind.value][1]
        assert type_cell == f"`{cls.__name__}`", kind
        documented = set(re.findall(r"`([^`]+)`(\??)", fields_cell))
        stored = {
            (cls.KEYS.get(f.name, f.name), "?" if f.name in cls.OMIT_NONE else "")
            for f in dataclasses.fields(cls)
            if f.name != "extra"
        }
        assert documented == stored, (kind, documented ^ stored)
