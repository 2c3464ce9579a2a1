"""Fixtures borrowed from other suites: the CLI harness (``cli``) of tests/ops, and the
per-test login roles (``login``) of tests/security."""

from tests.ops.conftest import cli
from tests.security.conftest import login

__all__ = ["cli", "login"]
