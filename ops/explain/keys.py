"""What a pending run of a keyed queue waits for (docs/how-to/queues.md "Concurrency keys"): its
key's rate, or a slot of its key; said by ``ops.explain.predict`` beside the queue's own."""

from __future__ import annotations

from runfleet.ops.cli.common import seconds
from runfleet.store.queues import KeyState, QueueSettings
from runfleet.store.types import RunRow


def key_wait(row: RunRow, queue: QueueSettings | None, key: KeyState | None) -> str | None:
    """The sentence, or None when neither of its key's limits holds the run back."""
    if queue is None or not queue.keyed or key is None:
        return None
    if key.wait_ms and queue.key_rate_per_s is not None:
        return (
            f"waiting for the rate limit of key {key.label} of queue {row.queue} "
            f"({queue.key_rate_per_s:g}/s per key): next token in {seconds(key.wait_ms)}."
        )
    limit = queue.key_concurrency
    if limit is not None and key.running >= limit:
        return (
            f"waiting for a slot of key {key.label} of queue {row.queue}: {key.running} of "
            f"{limit} in use; it starts when one of them settles or parks "
            f"({key.waiting} of the key's runs wait, oldest first; the queue's free slots go "
            "round-robin across keys)."
        )
    return None
