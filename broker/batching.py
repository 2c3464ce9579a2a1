"""Group commit's former home; it is ``runtime.batching`` (runfleet/runtime/batching.py).

Kept only while ``worker/settle.py`` still imports ``GroupCommit`` from here (a file
another change owns): delete this module once it imports ``runfleet.runtime.batching``.
"""

from runfleet.runtime.batching import Coalesce, GroupCommit

__all__ = ["Coalesce", "GroupCommit"]
