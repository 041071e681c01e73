"""Both log formats carry the object a line is about (`extra`), the text one as key=value."""

from __future__ import annotations

import logging
import sys

import orjson

from sidecarctl.manager.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("sidecarctl.supervisor", logging.INFO, __file__, 1, "manager %s", ("started",), None)
    record.__dict__.update(extra)
    return record


def test_text_lines_end_with_the_object_references_in_the_json_lines() -> None:
    record = _record(object="webhook=127.0.0.1:9443 run_dir=/tmp/r", sidecarset="mesh")
    text = TextFormatter().format(record)
    assert text.endswith(
        "INFO sidecarctl.supervisor: manager started sidecarset=mesh object=webhook=127.0.0.1:9443 run_dir=/tmp/r"
    )
    line = orjson.loads(JsonFormatter().format(record))
    assert (line["sidecarset"], line["object"]) == ("mesh", "webhook=127.0.0.1:9443 run_dir=/tmp/r")


def test_a_text_line_without_references_is_the_plain_line_and_a_traceback_stays_below_it() -> None:
    assert TextFormatter().format(_record()).endswith("INFO sidecarctl.supervisor: manager started")
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record(pod="ns/p")
        record.exc_info = sys.exc_info()
    first, _, rest = TextFormatter().format(record).partition("\n")
    assert first.endswith("manager started pod=ns/p") and "ValueError: boom" in rest
