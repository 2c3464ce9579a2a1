"""The lock an admission holds until its commit, and that a delivery's first read waits on.

A single ``enqueue`` may publish its wake before its commit has returned: the producer
takes this lock in its admission's transaction, publishes the wake, then inserts and
commits (``Admission.admit_each`` with ``on_locked``). A worker reading that wake waits
on the same lock (shared) in the statement before its read or claim, pipelined with it
in one round trip, so its read starts after the admission committed (Postgres releases a
transaction's locks after its commit record is flushed) and sees the row. The wake's
trip through Redis and the worker's read then overlap the admission's commit instead of
following it. Nothing else waits: a wake published after its commit finds the lock free.

The key is the run id's CRC-32 under a class of its own: two ids that share a key only
make a read wait for the other admission's commit too.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

LOCK_CLASS = 7320113
"""The advisory lock class of admissions (two-key form: apart from every other lock)."""


def lock_key(run_id: str) -> int:
    """The run id's key within ``LOCK_CLASS`` (a signed 32-bit integer)."""
    return zlib.crc32(run_id.encode("utf-8", "surrogatepass")) - (1 << 31)


def lock_params(run_id: str) -> dict[str, Any]:
    return {"lock_class": LOCK_CLASS, "key": lock_key(run_id)}


def locks_params(run_ids: Iterable[str]) -> dict[str, Any]:
    return {"lock_class": LOCK_CLASS, "keys": sorted({lock_key(r) for r in run_ids})}
