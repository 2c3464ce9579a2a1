"""Names that cross processes: ``module:qualname`` for code, ``host:pid:nonce`` for owners."""

from __future__ import annotations

import sys
from collections.abc import Callable

from runfleet.declaration.names import importable_name, load_from_path, qualified_name
from runfleet.store.types import Owner


def module_level() -> None:
    """A function another process can import by its name."""


def _nested() -> Callable[[], None]:
    def inner() -> None:
        pass

    return inner


def test_a_module_level_function_is_named_module_colon_qualname() -> None:
    assert qualified_name(module_level) == "tests.test_names:module_level"
    assert importable_name(module_level) == "tests.test_names:module_level"
    assert load_from_path("tests.test_names:module_level", lambda _: None) is None
    loaded = load_from_path("tests.test_names:module_level", sys.modules.get)
    assert loaded is module_level


def test_what_no_other_process_could_import_has_no_name() -> None:
    assert importable_name(lambda: None) is None
    assert importable_name(_nested()) is None
    assert importable_name(object()) is None
    assert qualified_name(_nested()).endswith("_nested.<locals>.inner")


def test_an_owner_key_parses_back_exactly() -> None:
    for owner in (Owner("h", 12, "ab"), Owner("pod:7:x", 4242, "c0ffee")):
        assert Owner.parse(owner.key) == owner


def test_anything_else_is_not_an_owner() -> None:
    for key in (None, "", "h:1", ":1:n", "h:1:", "h:x:n", "h:²:n", "h:12345678901:n"):
        assert Owner.parse(key) is None, key
