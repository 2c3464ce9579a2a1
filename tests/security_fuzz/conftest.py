"""Hostile-input fuzzing: every input ends in success or a typed error naming the field."""

from __future__ import annotations

import tests.trust.flows  # noqa: F401 - registers the flows the fuzzers enqueue
from tests.dashboard.conftest import dashboard  # noqa: F401 - the app over this test's services
from tests.ops.conftest import cli  # noqa: F401 - the real CLI against this test's services
