"""The CLI harness of tests/ops, for ``runfleet prune``."""

from tests.ops.conftest import cli

__all__ = ["cli"]
