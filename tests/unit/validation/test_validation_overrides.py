"""`spec.overrides` at /validate-sidecarset's entry point, and as the model reads it for injection.

Every refusal names its field; a bound the model cannot read allows nothing (the pods that ask are
refused, not given an unchecked value).
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import validate_sidecarset
from tests.kube import builders

GOOD = [{"containerName": "proxy", "resources": {"cpu": {"min": "50m", "max": "2"}}, "env": ["LOG_LEVEL"]}]


def sidecarset(overrides: Any) -> dict[str, Any]:
    return builders.sidecarset(
        "mesh",
        containers=[builders.container("proxy", "proxy:1")],
        init_containers=[builders.container("init", "init:1")],
        overrides=overrides,
    )


def errors(overrides: Any) -> list[str]:
    return [str(e) for e in validate_sidecarset(sidecarset(overrides))]


@pytest.mark.parametrize(
    "overrides",
    [
        GOOD,
        [{"containerName": "proxy", "resources": {"memory": {"max": "2Gi"}}}],
        [{"containerName": "proxy", "resources": {"cpu": {"min": 0, "max": 2}}}],  # numbers are quantities
        [{"containerName": "init", "env": ["A", "B.c", "d-e"]}],  # an init container is a sidecar too
        [{"containerName": "proxy", "resources": {"cpu": {"min": "1", "max": "1000m"}}}],  # equal by value
        [],
    ],
)
def test_valid_overrides_pass(overrides: Any) -> None:
    assert errors(overrides) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ("all", "spec.overrides: must be an array, not string"),
        ([3], "spec.overrides[0]: must be an object, not number"),
        ([{"resources": {"cpu": {"max": "1"}}}], "spec.overrides[0].containerName: Required value"),
        ([{"containerName": "nope", "env": ["A"]}], 'spec.overrides[0].containerName: Not found: "nope"'),
        (
            [*GOOD, {"containerName": "proxy", "env": ["B"]}],
            'spec.overrides[1].containerName: Duplicate value: "proxy"',
        ),
        ([{"containerName": "proxy"}], "spec.overrides[0]: Invalid value: "),
        (
            [{"containerName": "proxy", "resources": {"gpu": {"max": "1"}}}],
            'spec.overrides[0].resources: Unsupported value: "gpu": supported values: "cpu", "memory"',
        ),
        (
            [{"containerName": "proxy", "resources": {"cpu": {}}}],
            "spec.overrides[0].resources.cpu: Required value: min or max (or both)",
        ),
        (
            [{"containerName": "proxy", "resources": {"cpu": {"min": "3", "max": "2"}}}],
            'spec.overrides[0].resources.cpu.min: Invalid value: "3": must be less than or equal to max (2)',
        ),
        (
            [{"containerName": "proxy", "resources": {"cpu": {"max": "lots"}}}],
            'spec.overrides[0].resources.cpu.max: Invalid value: "lots": quantities must match',
        ),
        (
            [{"containerName": "proxy", "resources": {"memory": {"min": "-1Mi"}}}],
            'spec.overrides[0].resources.memory.min: Invalid value: "-1Mi": must be greater than or equal to 0',
        ),
        (
            [{"containerName": "proxy", "resources": {"cpu": {"max": True}}}],
            "spec.overrides[0].resources.cpu.max: must be a quantity (a string or a number), not boolean",
        ),
        ([{"containerName": "proxy", "env": ["A=B"]}], "spec.overrides[0].env[0]: invalid env var name 'A=B'"),
        ([{"containerName": "proxy", "env": [""]}], "spec.overrides[0].env[0]: env var name must be a non-empty"),
        ([{"containerName": "proxy", "env": ["A", "A"]}], 'spec.overrides[0].env[1]: Duplicate value: "A"'),
        ([{"containerName": "proxy", "env": "A"}], "spec.overrides[0].env: must be an array, not string"),
    ],
)
def test_each_mistake_is_refused_naming_its_field(overrides: Any, expected: str) -> None:
    found = errors(overrides)
    assert any(e.startswith(expected) for e in found), found


def test_the_model_reads_the_bounds() -> None:
    ss = SidecarSet.from_object(sidecarset(GOOD))
    (bounds,) = ss.overrides
    assert bounds.container == "proxy" and bounds.env == ("LOG_LEVEL",)
    cpu = bounds.range_of("cpu")
    assert cpu is not None and cpu.text() == "50m to 2"
    assert bounds.range_of("memory") is None


def test_without_overrides_nothing_may_be_overridden() -> None:
    assert SidecarSet.from_object(builders.sidecarset("mesh")).overrides == ()


@pytest.mark.parametrize(
    "overrides",
    [
        "all",
        [{"containerName": 3}],
        [{"containerName": "proxy", "resources": {"cpu": {"min": "x", "max": "2"}}}],
        [{"containerName": "proxy", "resources": {"cpu": "2"}}],
    ],
)
def test_a_bound_that_cannot_be_read_allows_nothing_and_never_stops_injection(overrides: Any) -> None:
    """Strict reading (injection) does not fail on it: the owner's other sidecars still inject."""
    ss = SidecarSet.from_object(sidecarset(overrides))
    assert all(b.range_of("cpu") is None for b in ss.overrides)
    assert ss.problem("spec.overrides") is not None


def test_one_sided_ranges_read_as_such() -> None:
    ss = SidecarSet.from_object(
        sidecarset([{"containerName": "proxy", "resources": {"cpu": {"min": "100m"}, "memory": {"max": "1Gi"}}}])
    )
    (bounds,) = ss.overrides
    cpu, memory = bounds.range_of("cpu"), bounds.range_of("memory")
    assert cpu is not None and cpu.text() == "at least 100m" and cpu.max is None
    assert memory is not None and memory.text() == "at most 1Gi" and memory.min is None
