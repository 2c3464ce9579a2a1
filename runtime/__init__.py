"""The machinery every runfleet process runs on, whichever layer it serves.

``runtime.service``: the service lifecycle (start, stop, wait for either edge) and the
``Signal``s tests wait on; ``runtime.batching``: group commit (``GroupCommit``) and
coalesced hints (``Coalesce``); ``runtime.embedded``: the embedded Postgres and Redis a
user's processes share on one machine. They import nothing of runfleet, so every package
may import them (``store.urls`` starts the embedded pair): the dependency rule is
``ops → worker → rqface → producer → broker → store``, with ``declaration`` and
``runtime`` beneath them (tests/test_layers.py).
"""
