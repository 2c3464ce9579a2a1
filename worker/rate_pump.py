"""The token pump of a rate-limited queue: gated wakes move when tokens are there.

Postgres decides a rate (the token bucket of ``runfleet.queue_free_slots``); a run refused
for want of a token has its wake parked at the queue's gate (``broker.gate``). Moving one
gated wake per due token would lose starts: a timer that fires late (a loaded event loop)
would move one wake for the several tokens accrued meanwhile, and once that wake started,
nothing would move the rest until some execution of the queue ended; every start the
bucket allowed but no wake reached would be lost.

The pump keeps going while the gate holds wakes: at each token's time it reads how many
whole tokens the bucket holds now and moves that many (at least one), then waits one
token's time (1/R s). A late tick finds more tokens and moves more wakes, so lateness
delays starts but loses none (the bucket keeps one second's tokens). One pump per queue
per process; several processes each pumping move more wakes than tokens, and a wake too
many is refused again and parked again, never lost. A hint like every message: a pump
that dies (Redis or Postgres unreachable) leaves the runs to the next refusal, the next
ended execution or the lost-wake sweep.
"""

from __future__ import annotations

import asyncio
import logging

from runfleet.broker.gate import Gate
from runfleet.store import Store

log = logging.getLogger("runfleet.worker.rate_pump")

MIN_TICK_S = 0.05
"""The shortest wait between two ticks: above 20/s a tick moves several tokens' wakes, so a
process reads the bucket at most 20 times a second whatever the rate."""


class RatePump:
    def __init__(self, store: Store, gate: Gate) -> None:
        self._store = store
        self._gate = gate
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._asked: dict[str, int] = {}
        """Refusals per queue so far: a pump that finds the gate empty stops only if no
        refusal came while it looked (that refusal's wake may be parked behind its read)."""

    def due(self, queue: str, after_ms: int) -> None:
        """A claim of ``queue`` was refused for want of a token, the next due in
        ``after_ms``: pump the queue's gate from then on (a pump already running covers it)."""
        self._asked[queue] = self._asked.get(queue, 0) + 1
        running = self._pumps.get(queue)
        if running is not None and not running.done():
            return
        self._pumps[queue] = asyncio.get_running_loop().create_task(
            self._pump(queue, max(after_ms, 1) / 1000), name=f"rate-pump:{queue}"
        )

    async def _pump(self, queue: str, delay_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(max(delay_s, MIN_TICK_S))
                asked = self._asked.get(queue, 0)
                bucket = await self._store.queues.bucket(queue)
                if bucket is None:  # a key's rate (or the queue's, lifted): one wake, once
                    await self._gate.open([queue])
                    return
                tokens, rate_per_s = bucket
                delay_s = 1 / rate_per_s  # the next token, if those moved take theirs
                if await self._gate.open([queue] * max(tokens, 1)) == 0:
                    if self._asked.get(queue, 0) == asked:
                        return  # nothing waits at the gate, and no refusal came meanwhile
                    # A refusal came while this tick looked: its ``due`` saw this pump still
                    # running and started none, and its wake may have been parked after the
                    # gate was read. Stopping here would leave it with no pump (a stalled rate).
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a hint: the lost-wake sweep backs it up
            log.warning("rate_pump.failed", extra={"queue": queue, "error": repr(exc)})

    def pumping(self) -> list[str]:
        """The queues being pumped now."""
        return sorted(q for q, task in self._pumps.items() if not task.done())

    async def close(self) -> None:
        """Stop every pump (a stopping worker moves no more wakes)."""
        tasks = [t for t in self._pumps.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pumps.clear()
