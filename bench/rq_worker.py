"""The rq peer's worker (benchmarks, rq parity tests): rq's ``SimpleWorker``, its command
channel polled every 0.2 s.

rq (2.12, 3.0) subscribes each worker to its command channel with a pubsub thread polling
every 60 s, and at teardown unsubscribes, then stops the thread. redis-py 8.2's
``PubSubWorkerThread.stop()`` joins the thread without a bound, and once the unsubscribe
is confirmed the thread waits its whole poll interval for a subscription that never
comes: a burst of rq's own worker then returned after about a minute now and then
(faulthandler caught it in ``unsubscribe``; CI failed twice on rq's side of
``test_requeue`` and ``test_blocking_result_fetch``), and a benchmark's burst drain timed to
the workers' exit would have charged rq that minute. Only the interval differs from rq's
worker here; what the worker does with its commands is rq's. Part of bench/, as the rest
of rq's side: workers load it from a checkout (``--worker-class
bench.rq_worker.SimpleWorker``, the checkout's root on their path).
"""

from __future__ import annotations

import rq

POLL_S = 0.2


def _subscribe(worker: rq.Worker | rq.SimpleWorker) -> None:
    worker.pubsub = worker.connection.pubsub()
    worker.pubsub.subscribe(**{worker.pubsub_channel_name: worker.handle_payload})
    worker.pubsub_thread = worker.pubsub.run_in_thread(  # type: ignore[assignment]  # rq annotates it None
        sleep_time=POLL_S, daemon=True, exception_handler=worker._pubsub_exception_handler
    )


class SimpleWorker(rq.SimpleWorker):
    def subscribe(self) -> None:
        _subscribe(self)


class Worker(rq.Worker):
    """rq's forking ``Worker`` (what ``send_stop_job_command`` needs: a work horse to
    kill), with the same poll."""

    def subscribe(self) -> None:
        _subscribe(self)
