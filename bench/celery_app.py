"""The Celery side's app: one no-op task, Redis broker and result backend, late acks.

``make_app`` builds it for the benchmark's producer; the worker processes it spawns
(``celery -A bench.celery_app worker``) build the same from the environment:
``RF_CELERY_REDIS`` (URL), ``RF_CELERY_QUEUE``, ``RF_CELERY_PREFIX`` (every key the run
writes starts with it, so the benchmark removes them without touching anything else).
"""

from __future__ import annotations

import os

from celery import Celery

TASK = "rf_bench.noop"


def make_app(url: str, queue: str, prefix: str) -> Celery:
    app = Celery("rf_bench", broker=url, backend=url)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,  # as runfleet acknowledges a wake only once its drive decided
        task_ignore_result=False,  # the result's date_done is each task's completion time
        result_expires=3600,
        broker_transport_options={"global_keyprefix": prefix},
        result_backend_transport_options={"global_keyprefix": prefix},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name=TASK)  # type: ignore[untyped-decorator]  # celery ships no annotations
    def noop() -> int:
        """Does nothing, as the rq job and the runfleet flow do, and answers the pid of the
        child that ran it: the benchmark's steady window waits for every child's first."""
        return os.getpid()

    return app


app = make_app(
    os.environ.get("RF_CELERY_REDIS", "redis://127.0.0.1:6379/0"),
    os.environ.get("RF_CELERY_QUEUE", "rf-bench-celery"),
    os.environ.get("RF_CELERY_PREFIX", "rf-bench-celery:"),
)
