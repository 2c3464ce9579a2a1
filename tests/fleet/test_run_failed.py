"""A failed run reads as the run's own error at the producer (``RunFailed``).

What a producer meets when the code it enqueued raised: the first line is the run's
``Type: message``, the original type is reachable, a builtin type is the raised error's
type too (as in-process), and the worker's traceback is printed as text, not escaped.
"""

from __future__ import annotations

import asyncio
import pickle
import traceback

import pytest

import tests.fleet.flows as flows
from runfleet import Queue
from runfleet.producer import AsyncQueue, RunFailed
from runfleet.store.config import Settings
from runfleet.worker import Context, flow
from runfleet.worker.process import Worker


class LedgerMismatch(Exception):
    """A user's own exception type: never imported or re-created at the producer."""


@flow(name="tests.run_failed.own_type")
async def own_type(ctx: Context) -> None:
    raise LedgerMismatch("books do not balance")


@flow(name="tests.run_failed.key")
async def key_error(ctx: Context) -> None:
    raise KeyError("sku-1")


async def test_builtin_error_is_the_runs_own(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(flows.boom, "bad input")
    with pytest.raises(ValueError) as caught:  # the type the flow raised, as in-process
        await run.result(timeout=10)
    err = caught.value
    assert isinstance(err, RunFailed)  # and `except RunFailed` still catches every failure
    assert str(err).splitlines()[0] == "ValueError: bad input"
    assert err.exc_type == "ValueError" and err.exc_message == "bad input"
    assert err.run_id == run.id
    assert err.remote_traceback is not None
    assert "raise ValueError(message)" in err.remote_traceback
    printed = "".join(traceback.format_exception(err))
    assert "raise ValueError(message)\n" in printed  # lines, not one escaped dict
    assert "\\n" not in printed and "'traceback':" not in printed
    again = pickle.loads(pickle.dumps(err))  # crosses a process boundary intact
    assert type(again) is type(err) and str(again) == str(err)


async def test_other_types_are_named_not_imported(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(own_type)
    with pytest.raises(RunFailed) as caught:
        await run.result(timeout=10)
    err = caught.value
    assert not isinstance(err, LedgerMismatch)  # a type named by a row is never imported
    assert str(err).splitlines()[0] == "LedgerMismatch: books do not balance"
    assert err.exc_type == "LedgerMismatch" and err.exc_module == __name__
    keyed = await queue.enqueue(key_error)
    with pytest.raises(KeyError) as missing:
        await keyed.result(timeout=10)
    assert str(missing.value).splitlines()[0] == "KeyError: 'sku-1'"  # not KeyError's repr


async def test_sync_queue_raises_the_same(worker: Worker, settings: Settings) -> None:
    def produce() -> BaseException:
        with Queue("default", settings=settings) as q:
            job = q.enqueue(flows.boom, "bad input")
            with pytest.raises(ValueError, match=r"^ValueError: bad input") as caught:
                job.wait(timeout=10)
        return caught.value

    # The blocking producer in a thread of its own: the worker runs on this loop.
    assert isinstance(await asyncio.to_thread(produce), RunFailed)
