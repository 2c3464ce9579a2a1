"""Redis: wake-up and schedule streams, settled/cancel notifications, liveness keys, the codec.

Hints and liveness only: Postgres (``runfleet.store``) holds the truth. Nothing here
imports the producer (``runfleet.producer``), rq's face (``runfleet.rqface``) or the worker.
"""
