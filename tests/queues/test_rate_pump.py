"""The token pump (real Postgres and Redis): a tick moves as many gated wakes as the rate's
bucket holds whole tokens, so a late tick loses no start; it goes on while the gate holds
wakes and stops when it is empty or the rate is lifted."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from runfleet.broker.gate import Gate
from runfleet.broker.keys import Keys
from runfleet.broker.streams import Lane, Streams
from runfleet.store import Store
from runfleet.worker.rate_pump import RatePump
from tests.support.polling import until


async def test_a_late_tick_moves_every_accrued_tokens_wake(
    store: Store, redis_url: str, redis_prefix: str
) -> None:
    await store.queues.set("metered", rate_per_s=5)  # a full bucket: 5 tokens
    client = Redis.from_url(redis_url)
    try:
        streams = Streams(client, redis_prefix)
        gate = Gate(client, redis_prefix, streams)
        await gate.park([("metered", f"r{i}", "f") for i in range(12)])
        pump = RatePump(store, gate)
        lane = streams.stream_key("metered", Lane.RECOVERY)

        async def moved() -> int:
            entries: list[Any] = await client.xrange(lane) or []
            return len(entries)

        pump.due("metered", 1)
        pump.due("metered", 1)  # one pump per queue: the second refusal joins the first
        assert pump.pumping() == ["metered"]
        # Nothing takes the tokens here, so every tick finds the bucket full and moves 5:
        # a tick that moved one wake (the timer before the pump) would leave 4 a tick.
        await until(lambda: _at_least(moved, 1), 5, "the first tick")
        # One tick moved the 5 (one pipeline); one wake a tick would need 4 more ticks of
        # 200 ms each to get there.
        await until(lambda: _at_least(moved, 5), 0.5, "the first tick's 5 wakes")
        await until(lambda: _at_least(moved, 12), 5, "the gate emptied")
        assert await client.zcard(Keys(redis_prefix).gate("metered")) == 0

        async def stopped() -> bool:
            return pump.pumping() == []

        await until(stopped, 5, "the pump to stop at an empty gate")
        # A lifted rate: one wake moves once, and the pump stops.
        await store.queues.set("metered", rate_per_s=0)
        await gate.park([("metered", "late", "f")])
        pump.due("metered", 1)
        await until(lambda: _at_least(moved, 13), 5, "the lifted rate's one wake")
        await until(stopped, 5, "the pump to stop")
        await pump.close()
    finally:
        await client.aclose()


async def _at_least(read: Any, n: int) -> bool:
    return bool(await read() >= n)


class _RacingGate:
    """A gate whose first open finds nothing while a refusal lands (its ``due`` called
    during the read, its wake parked just after), then holds that one wake."""

    def __init__(self) -> None:
        self.pump: RatePump | None = None
        self.held = 0
        self.opened: list[int] = []

    async def open(self, queues: list[str]) -> int:
        if not self.opened:
            assert self.pump is not None
            self.pump.due("metered", 1)  # the refusal, while the pump looks
            self.held = 1  # ... and its wake, parked after the read
            self.opened.append(0)
            return 0
        moved, self.held = self.held, 0
        self.opened.append(moved)
        return moved


async def test_a_refusal_while_the_pump_finds_the_gate_empty_keeps_it_pumping(
    store: Store,
) -> None:
    """The refusal's ``due`` sees the pump still running and starts none; the pump must not
    then stop on the empty read it made before that wake was parked (a stalled rate: one
    full test run once saw 33 starts of 244 in a minute)."""
    await store.queues.set("metered", rate_per_s=20)
    gate = _RacingGate()
    pump = RatePump(store, gate)  # type: ignore[arg-type]  # a fake with Gate's one used method
    gate.pump = pump
    pump.due("metered", 1)

    async def stopped() -> bool:
        return pump.pumping() == []

    await until(stopped, 5, "the pump to stop")
    assert gate.opened[:2] == [0, 1], gate.opened  # it looked again and moved the wake
    await pump.close()
