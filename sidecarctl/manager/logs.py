"""JSON log lines with the object they are about, for log pipelines and `jq`.

Each line carries time, level, logger and message, plus whichever object reference the call
site passed in `extra` (`sidecarset`, `pod`, `namespace`, `object`), so one can filter the
manager's log by the SidecarSet or pod in question. The logger name is part of the same contract:
a module names its logger explicitly, so moving the module does not rename it.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys

import orjson

REF_KEYS = ("sidecarset", "pod", "namespace", "object", "webhook", "configuration")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in REF_KEYS:
            value = record.__dict__.get(key)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """One line for a terminal: the same object references as the JSON lines, as `key=value` after
    the message (a reader of `--log-format=text` must not lose which object a line is about)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        refs = [f"{key}={record.__dict__[key]}" for key in REF_KEYS if record.__dict__.get(key) is not None]
        if not refs:
            return line
        head, sep, rest = line.partition("\n")  # a traceback stays below the first line
        return f"{head} {' '.join(refs)}{sep}{rest}"


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("hypercorn.access", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
