"""A producer script run as ``python -m tests.broker.main_producer N``: its function is
``__main__``'s, which a worker imports under the module's own name."""

from __future__ import annotations

import sys

from runfleet import Queue


def double(n: int) -> int:
    return 2 * n


if __name__ == "__main__":
    with Queue("default") as q:  # the RUNFLEET_* environment names the servers
        print(q.enqueue(double, int(sys.argv[1])).id)
