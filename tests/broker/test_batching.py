"""GroupCommit and Coalesce: what batches together, and who learns which outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from runfleet.runtime.batching import Coalesce, GroupCommit


class Refused(Exception):
    pass


async def test_callers_ready_together_share_one_flush_and_each_gets_its_answer() -> None:
    flushes: list[list[int]] = []

    async def flush(items: Sequence[int]) -> list[int]:
        flushes.append(list(items))
        await asyncio.sleep(0.01)  # a round trip: later callers queue for the next flush
        return [i * 10 for i in items]

    batch: GroupCommit[int, int] = GroupCommit(flush)
    first = await asyncio.gather(*(batch.submit(i) for i in range(5)))
    assert first == [0, 10, 20, 30, 40] and flushes == [[0, 1, 2, 3, 4]]
    # Submitted while a flush is in flight: they wait for it, then go out together.
    one = asyncio.create_task(batch.submit(1))
    await asyncio.sleep(0.001)
    rest = [asyncio.create_task(batch.submit(i)) for i in (2, 3)]
    assert [await t for t in (one, *rest)] == [10, 20, 30]
    assert flushes[1:] == [[1], [2, 3]]


async def test_an_idle_caller_is_flushed_at_once() -> None:
    async def flush(items: Sequence[str]) -> list[str]:
        return list(items)

    batch: GroupCommit[str, str] = GroupCommit(flush)
    assert await asyncio.wait_for(batch.submit("x"), timeout=0.5) == "x"


async def test_an_isolated_error_reaches_only_the_item_at_fault() -> None:
    calls: list[list[str]] = []

    async def flush(items: Sequence[str]) -> list[str]:
        calls.append(list(items))
        if "bad" in items:
            raise Refused("refused")
        return [s.upper() for s in items]

    batch: GroupCommit[str, str] = GroupCommit(flush, isolate=(Refused,))
    results = await asyncio.gather(
        *(batch.submit(s) for s in ("a", "bad", "c")), return_exceptions=True
    )
    assert results[0] == "A" and results[2] == "C"
    assert isinstance(results[1], Refused)
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


async def test_any_other_error_reaches_every_caller_of_that_batch_only() -> None:
    failing = True

    async def flush(items: Sequence[int]) -> list[int]:
        if failing:
            raise ConnectionError("down")
        return list(items)

    batch: GroupCommit[int, int] = GroupCommit(flush, isolate=(Refused,))
    results = await asyncio.gather(*(batch.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    failing = False
    assert await batch.submit(7) == 7, "the next batch is not poisoned"


async def test_an_answer_that_is_an_exception_is_raised_to_its_caller() -> None:
    async def flush(items: Sequence[int]) -> list[int | BaseException]:
        return [Refused(str(i)) if i == 2 else i for i in items]

    batch: GroupCommit[int, int] = GroupCommit(flush)
    results = await asyncio.gather(*(batch.submit(i) for i in range(4)), return_exceptions=True)
    assert results[0:2] == [0, 1] and results[3] == 3 and isinstance(results[2], Refused)


async def test_a_batch_never_exceeds_max_items() -> None:
    sizes: list[int] = []

    async def flush(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        return list(items)

    batch: GroupCommit[int, int] = GroupCommit(flush, max_items=4)
    assert await asyncio.gather(*(batch.submit(i) for i in range(10))) == list(range(10))
    assert sizes == [4, 4, 2]


async def test_coalesce_sends_one_batch_per_turn_and_survives_a_failing_send() -> None:
    sent: list[list[int]] = []

    async def send(items: list[int]) -> None:
        sent.append(items)
        if 99 in items:
            raise RuntimeError("hint lost")

    hints: Coalesce[int] = Coalesce(send)
    for i in range(3):
        hints.add(i)
    await hints.drain()
    hints.add(99)
    await hints.drain()
    hints.add(4)
    await hints.drain()
    assert sent == [[0, 1, 2], [99], [4]]


def test_max_items_must_be_positive() -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        return list(items)

    with pytest.raises(ValueError):
        GroupCommit(flush, max_items=0)
