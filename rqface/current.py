"""rq's ``get_current_job()``: the job whose function is running in this context.

A context variable the worker sets around a plain function's call (rqface/running.py)
and copies into the function's thread; outside a job it is None, as in rq. It lives in
``rqface`` so producer code and job code import it from where they import ``Queue``.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

current_job: ContextVar[Any] = ContextVar("runfleet_current_job", default=None)


def get_current_job(connection: Any = None, job_class: Any = None) -> Any:
    """The running job (rq's ``get_current_job``), or None outside a job.

    Inside a runfleet worker it has ``id``, ``func_name``, ``origin``, ``args``,
    ``kwargs``, ``meta`` (with ``save_meta()``), ``description``, ``get_status()`` and
    ``dependencies_are_met()``; under ``Queue(is_async=False)`` it is the inline job.
    """
    return current_job.get()
