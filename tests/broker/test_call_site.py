"""``called_at_site``: a read that is the callee of a call at its own site, and no other.

``Job.result`` rests on it (rq's value when read, the old waiting call when called), so
every spelling a caller writes is checked, also once the interpreter has specialised the
load (after a few thousand runs) and with more names than one byte can index.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from runfleet.rqface.call_site import called_at_site


class Probe:
    """``result`` answers whether its read is being called, and is callable either way."""

    @property
    def result(self) -> Any:
        called = called_at_site(sys._getframe(1), "result")
        return lambda *args, **kwargs: ("called" if called else "read", args, kwargs)

    @property
    def other(self) -> Any:
        called = called_at_site(sys._getframe(1), "result")  # asked about another name
        return lambda *args, **kwargs: ("called" if called else "read", args, kwargs)


def call_positional(p: Probe) -> Any:
    return p.result(30)


def call_keyword(p: Probe) -> Any:
    return p.result(timeout=3)


def call_bare(p: Probe) -> Any:
    return p.result()


def call_in_an_argument(p: Probe) -> Any:
    return [p.result(1)][0]


def read_then_call(p: Probe) -> Any:
    handed = p.result
    return handed(30)


def read_as_an_argument(p: Probe) -> Any:
    return (lambda f, *a: f(*a))(p.result, 30)


def read_through_getattr(p: Probe) -> Any:
    name = "result"
    return getattr(p, name)(30)


def read_in_a_comprehension(p: Probe) -> Any:
    return next(q.result for q in [p])(30)


def call_another_name(p: Probe) -> Any:
    return p.other(30)


CALLED: list[Callable[[Probe], Any]] = [
    call_positional,
    call_keyword,
    call_bare,
    call_in_an_argument,
]
READ: list[Callable[[Probe], Any]] = [
    read_then_call,
    read_as_an_argument,
    read_through_getattr,
    read_in_a_comprehension,
    call_another_name,
]


@pytest.mark.parametrize("site", CALLED, ids=lambda f: f.__name__)
def test_a_call_at_the_site_is_seen(site: Callable[[Probe], Any]) -> None:
    for _ in range(3000):  # the first runs, then the specialised instruction
        assert site(Probe())[0] == "called"


@pytest.mark.parametrize("site", READ, ids=lambda f: f.__name__)
def test_every_other_read_is_a_read(site: Callable[[Probe], Any]) -> None:
    for _ in range(3000):
        assert site(Probe())[0] == "read"


def test_names_past_one_byte_of_index() -> None:
    """``result`` at a name index an ``EXTENDED_ARG`` carries (over 255, over 127 on 3.12+)."""
    lines = [f"    _ = p.n{i} if p is None else 0" for i in range(300)]
    source = "\n".join(["def far(p):", *lines, "    return p.result(7), p.result"])
    space: dict[str, Any] = {}
    exec(compile(source, "<far>", "exec"), space)
    far = space["far"]
    assert far.__code__.co_names.index("result") > 255
    for _ in range(3000):
        called, read = far(Probe())
        assert called == ("called", (7,), {})
        assert read()[0] == "read"


def test_no_frame_is_a_read() -> None:
    assert called_at_site(None, "result") is False
