"""Figures from samples: percentiles, rates and a process's resident memory."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from runfleet.ops.bench.scratch import BenchError


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (inclusive method); 0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident set (``VmRSS``) or peak (``VmHWM``) in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"/proc/{pid}/status has no {field}")


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")
