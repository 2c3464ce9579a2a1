"""runfleet beside its peers (rq, Celery, DBOS): side-by-side benchmarks run from a checkout.

Not part of the wheel: ``python -m bench COMMAND`` from the repository's root, with the
``bench`` extra installed (``pip install -e '.[dev,bench]'``). Every benchmark runs in
scratch databases and Redis keys of its own, dropped afterwards.
"""
