"""The CLI harness (``cli`` fixture) of tests/ops, for ``runfleet schedule``."""

from tests.ops.conftest import cli

__all__ = ["cli"]
