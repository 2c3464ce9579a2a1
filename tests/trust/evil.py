"""Names a hostile producer or database might hand a worker: none of them may run.

Lives under ``tests`` (allowed by the test harness's ``RUNFLEET_ALLOW_IMPORT=tests``), so
what refuses these is the resolution rule itself, not the allow-list.
"""

from __future__ import annotations

import os  # noqa: F401 - reachable as ``tests.trust.evil:os.system`` unless the walk refuses
from os import (
    getenv,  # noqa: F401 - a re-exported function, not defined here
    system,  # noqa: F401 - a builtin
)
