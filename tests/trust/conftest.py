"""Trust-boundary tests: an in-process worker and producer over the test's own services."""

from __future__ import annotations

import tests.trust.flows  # noqa: F401 - registers the flows these tests drive
from tests.ops.conftest import cli  # noqa: F401 - the real CLI against this test's services
