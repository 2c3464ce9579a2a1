"""The machinery every runfleet process runs on, whichever layer it serves.

``runtime.service``: the service lifecycle (start, stop, wait for either edge) and the
``Signal``s tests wait on; ``runtime.batching``: group commit (``GroupCommit``) and
coalesced hints (``Coalesce``). Both import nothing of runfleet, so every package may
import them (``store`` does not need to): the dependency rule is
``ops → worker → broker → store``, with ``runtime`` beside them all.
"""
