"""Logging setup: readable lines by default, one JSON object per line when asked.

Log calls use stable event names as the message (``run.stolen``) and put the
facts in ``extra``; the JSON formatter emits those facts as fields.
"""

from __future__ import annotations

import json
import logging
import time

_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL event k=v ...``; a ``traceback`` field (``run.failed``) follows on the
    lines below, as a logged exception's does."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        trace = extras.pop("traceback", None)
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if trace:
            base += "\n" + str(trace).rstrip("\n")
        return base


def configure(level: str = "INFO", *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if json_lines else TextFormatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("psycopg.pool", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
