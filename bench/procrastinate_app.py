"""The procrastinate side's app: one no-op task on a scratch database of its own.

The worker processes the benchmark spawns
(``python -m procrastinate --app=bench.procrastinate_app.app worker``) build it from the
environment: ``RF_PROCRASTINATE_DSN`` (a libpq connection string or URL of the scratch
database its schema was applied to). The producers never import it: they defer the task by
its name (``App.configure_task``) on an app of their own, as a service that does not
import the worker's code does.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

TASK = "rf_bench.noop"

app = App(connector=PsycopgConnector(conninfo=os.environ.get("RF_PROCRASTINATE_DSN", "")))


@app.task(name=TASK)
async def noop() -> None:
    """Does nothing, as the rq job, the Celery task and the runfleet flow do (async, as the
    runfleet flow is: no thread per job)."""
