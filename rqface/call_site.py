"""Whether an attribute read is the callee of a call written at its own site.

``job.result`` is rq's property (a value), and was runfleet's waiting method: the spelling
``job.result(timeout)`` must keep waiting while every other read answers the value. The two
differ only at the caller's site, so the read looks there: CPython compiles
``obj.name(...)`` to a method load (``LOAD_METHOD`` on 3.11, ``LOAD_ATTR`` with the low bit
of its argument set on 3.12+) and every other read (``x = obj.name``, ``f(obj.name)``,
``obj.name is None``) to a plain ``LOAD_ATTR``. Checked on CPython 3.11, 3.12 and 3.13, with
the instruction specialised (``f_lasti`` then points at its inline cache) and with an
``EXTENDED_ARG``. Where the site cannot be read this answers False: the read is then a
value, which is rq's meaning.
"""

from __future__ import annotations

import dis
import sys
from types import FrameType

_CACHE = dis.opmap["CACHE"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_LOAD_ATTR = dis.opmap["LOAD_ATTR"]
_METHOD_BIT = sys.version_info >= (3, 12)
"""3.12+: ``LOAD_ATTR``'s argument is ``name_index << 1 | loads_a_method``."""
_LOAD_METHOD = -1 if _METHOD_BIT else dis.opmap["LOAD_METHOD"]


def called_at_site(frame: FrameType | None, name: str) -> bool:
    """``frame`` is executing ``<obj>.<name>(...)``: a method load of ``name``, now."""
    if frame is None:
        return False
    code = frame.f_code
    raw = code.co_code  # the unspecialised instructions: cache entries read as CACHE
    at = frame.f_lasti
    if not 0 <= at < len(raw) - 1:
        return False
    while at > 0 and raw[at] == _CACHE:  # a specialised load stopped inside its cache
        at -= 2
    op, arg = raw[at], raw[at + 1]
    back, shift = at - 2, 8
    while back >= 0 and raw[back] == _EXTENDED_ARG:
        arg |= raw[back + 1] << shift
        back, shift = back - 2, shift + 8
    if op == _LOAD_METHOD:
        index = arg
    elif op == _LOAD_ATTR and _METHOD_BIT and arg & 1:
        index = arg >> 1
    else:
        return False
    return index < len(code.co_names) and code.co_names[index] == name
