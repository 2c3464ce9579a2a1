"""Run blocking code in a thread without letting a cancellation outrun the thread.

``asyncio.to_thread`` returns as soon as the awaiting task is cancelled, while the
thread goes on. For a run that is dangerous: the drive would release the run (or
record a cancellation) while its step is still executing here, and another worker
would start the same step at the same time. ``in_thread`` keeps the awaiting task
alive until the thread has really ended, then re-raises the cancellation. If the
thread cannot end before the lease could turn stale, the fail-stop watchdog
(``worker.watchdog``) ends the whole process instead; on a stop, the process ends at
its stop deadline (``worker.stopping``) and the run is taken over as after a kill.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the default executor; a cancel waits for the thread to end."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    future = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # The thread cannot be stopped from here; wait for it (its result no longer
        # matters), then let the cancellation go on. Further cancels while waiting are
        # absorbed: leaving early is exactly what this function exists to prevent.
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # retrieved, so a failure is not reported as never seen
        raise
