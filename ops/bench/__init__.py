"""Benchmarks of your own servers and machine: ``runfleet bench store|capacity|limits``.

Every benchmark runs in a scratch database it creates and drops itself (``scratch``),
so a figure never depends on rows an earlier run left behind. The benchmarks beside
runfleet's peers live in a checkout's bench/ folder (``python -m bench``), never here.
"""
