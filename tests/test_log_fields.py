"""No log call passes a field that ``logging`` reserves for its own record.

``log.warning("x", extra={"module": m})`` raises ``KeyError: "Attempt to overwrite 'module'
in LogRecord"`` inside the logging call itself: the line is lost and a traceback is printed
instead, every time the call is reached. The walk reads every ``extra=`` of the tree (a
dict literal, ``dict(...)``, or a name bound to either in the same function, with the keys
its subscript assignments add) and every field passed by keyword to the rate-limited
loggers (``broker.hostile``), whose keywords become ``extra``.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Iterator
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
RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
FIELD_LOGGERS = frozenset({"rate_limited", "dropped", "error_reply"})
"""Helpers whose ``**fields`` become a log call's ``extra`` (``broker.hostile``)."""


def _files() -> Iterator[Path]:
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(p.is_symlink() for p in (path, *path.parents) if p != ROOT):
                continue  # runfleet/store etc. are the folders themselves
            yield path


def _dict_keys(node: ast.expr) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Dict):
        for key in node.keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield key.value, key.lineno
            elif key is None:  # {**other}: the other dict's keys are checked where it is built
                continue
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        for keyword in node.keywords:
            if keyword.arg is not None:
                yield keyword.arg, node.lineno
        for arg in node.args:
            yield from _dict_keys(arg)


def _bound_keys(scope: ast.AST, name: str) -> Iterator[tuple[str, int]]:
    """Keys of what ``name`` is bound to in ``scope``: assignments and ``name["k"] = ...``."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name and node.value is not None:
                    yield from _dict_keys(node.value)
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == name
                    and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str)
                ):
                    yield target.slice.value, target.lineno


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _calls(node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.Call, ast.AST]]:
    """Every call under ``node`` with its innermost enclosing function (or the module)."""
    for child in ast.iter_child_nodes(node):
        inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
        if isinstance(child, ast.Call):
            yield child, scope
        yield from _calls(child, inner)


def collisions(source: str) -> list[tuple[int, str]]:
    """(line, field) of every log field in ``source`` that a LogRecord attribute owns."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for call, scope in _calls(tree, tree):
        callee = _callee(call)
        if callee is not None and callee[:1].isupper():
            continue  # a class built with an ``extra`` field of its own, not a log call
        keys: list[tuple[str, int]] = []
        for keyword in call.keywords:
            if keyword.arg == "extra":
                if isinstance(keyword.value, ast.Name):
                    keys += _bound_keys(scope, keyword.value.id)
                else:
                    keys += _dict_keys(keyword.value)
            elif keyword.arg is not None and _callee(call) in FIELD_LOGGERS:
                keys.append((keyword.arg, call.lineno))
        found += [(line, key) for key, line in keys if key in RESERVED]
    return found


def test_the_walk_finds_what_logging_refuses() -> None:
    """The walk itself: each spelling that crashes a log call is found (else it checks nothing)."""
    source = """
def f(log, m, hostile):
    log.warning("a", extra={"module": m})
    log.info("b", extra=dict(name=m))
    fields = {"ok": 1}
    fields["lineno"] = 2
    log.info("c", extra=fields)
    hostile.rate_limited(log, 30, "d", filename=m)
    log.info("e", extra={"run_id": m, "error": m})
    RunError(type="Boom", extra={"message": m})
"""
    assert sorted(collisions(source)) == [
        (3, "module"),
        (4, "name"),
        (6, "lineno"),
        (8, "filename"),
    ]
    record = logging.makeLogRecord({})
    assert "module" in vars(record)  # what the walk's RESERVED is made of


def test_no_log_field_overwrites_a_log_record_attribute() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: extra field {key!r} is a LogRecord attribute"
        for path in _files()
        for line, key in collisions(path.read_text())
        if path.name != "test_log_fields.py"
    ]
    assert not bad, "log calls that raise KeyError in logging:\n" + "\n".join(bad)
