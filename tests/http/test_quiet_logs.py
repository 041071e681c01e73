"""Malformed input is answered as bad input: a denial or a 4xx with the reason, never an
'unexpected error' (which would log) and never a traceback in the log or on the wire."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecarsets.spec import names
from tests.http.test_fuzz import CLIENT, json_values
from tests.http.test_inject_app import review

anything = json_values | st.dictionaries(st.sampled_from(["labels", "annotations", "name"]), json_values)
odd_pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": anything,
        "spec": json_values
        | st.fixed_dictionaries({"containers": json_values | st.lists(json_values, max_size=3)}, optional={}),
        "status": json_values,
    },
)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def records() -> Any:
    handler = Records()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": "x", "spec": {"containers": [{"name": "a"}]}},
        {"metadata": {"labels": "x"}, "spec": {"containers": [{"name": "a"}]}},
        {"metadata": {"labels": {"app": "shop"}}, "spec": "x"},
        {"metadata": {"labels": {"app": "shop"}}, "spec": {"containers": [{"name": "a", "env": "x"}]}},
        {"metadata": {"labels": {"app": "shop"}}, "spec": {"containers": [{"name": "a"}], "volumes": [{"name": 3}]}},
        {"metadata": None, "spec": None},
        [],
        "pod",
    ],
)
def test_known_malformed_pods_are_denied_with_the_field_and_log_nothing(obj: Any, records: Records) -> None:
    before = len(records.records)
    r = CLIENT.post(names.INJECT_PATH, content=orjson.dumps(review(obj)), headers={"content-type": "application/json"})
    assert r.status_code in (200, 400), r.text
    assert "Traceback" not in r.text and "see the manager's log" not in r.text
    assert records.records[before:] == []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=odd_pods)
def test_arbitrary_pod_shapes_never_reach_the_unexpected_path(obj: dict[str, Any]) -> None:
    r = CLIENT.post(names.INJECT_PATH, content=orjson.dumps(review(obj)), headers={"content-type": "application/json"})
    assert r.status_code < 500
    assert "see the manager's log" not in r.text, f"unexpected error for {obj!r}"
