"""Benchmarks: runfleet against the best this Postgres (or a rival queue) can do.

Every benchmark runs in a scratch database it creates and drops itself (``scratch``),
so a figure never depends on rows an earlier run left behind. Run ``python -m ops.bench``.
"""
