"""The lifecycle tests' fixtures: the CLI runner of the ops tests."""

from __future__ import annotations

from tests.ops.conftest import cli  # noqa: F401 - a fixture, used by name
from tests.security.conftest import login  # noqa: F401 - a fixture, used by name
