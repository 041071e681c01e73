"""Validation never raises: any JSON, and any mutation of a valid SidecarSet, gives FieldErrors."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecarsets.validation import FieldError, validate_sidecarset
from tests.unit.install.test_crd_schema import kruise_sample

Path = tuple[str | int, ...]

VOCABULARY = [
    "metadata",
    "name",
    "spec",
    "selector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "namespace",
    "namespaceSelector",
    "containers",
    "initContainers",
    "image",
    "env",
    "volumeMounts",
    "mountPath",
    "restartPolicy",
    "transferEnv",
    "sourceContainerName",
    "sourceContainerNameFrom",
    "fieldRef",
    "fieldPath",
    "envName",
    "envNames",
    "resourcesPolicy",
    "resourcesExpr",
    "limits",
    "cpu",
    "volumes",
    "updateStrategy",
    "type",
    "partition",
    "maxUnavailable",
    "priorityStrategy",
    "weightPriority",
    "orderPriority",
    "scatterStrategy",
    "injectionStrategy",
    "revision",
    "policy",
    "patchPodMetadata",
    "annotations",
    "patchPolicy",
    "upgradeStrategy",
    "upgradeType",
    "shareVolumePolicy",
    "podInjectPolicy",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(["", "Always", "RollingUpdate", "30%", "{}", "[", "metadata.name", "a" * 70]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=4)), children, max_size=5),
    ),
    max_leaves=30,
)


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    yield prefix
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from paths(sub, (*prefix, i))


SAMPLE = kruise_sample()
SAMPLE_PATHS = [p for p in paths(SAMPLE) if p]


def mutated(path: Path, replacement: Any, delete: bool) -> Any:
    obj = copy.deepcopy(SAMPLE)
    parent: Any = obj
    for part in path[:-1]:
        parent = parent[part]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return obj


def check(errs: Any) -> None:
    assert isinstance(errs, list)
    for err in errs:
        assert isinstance(err, FieldError)
        assert isinstance(err.field, str) and err.field
        assert isinstance(err.reason, str) and err.reason
        str(err)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_any_json_is_answered_with_field_errors(obj: Any) -> None:
    check(validate_sidecarset(obj))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["metadata", "spec"]), json_values), json_values, st.lists(json_values, max_size=3)
)
def test_any_json_as_old_and_others(obj: Any, old: Any, others: list[Any]) -> None:
    check(validate_sidecarset(obj, old=old, others=others))
    check(validate_sidecarset(SAMPLE, old=obj, others=[obj, *others]))


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(SAMPLE_PATHS), json_values, st.booleans())
def test_mutations_of_a_valid_sidecarset(path: Path, replacement: Any, delete: bool) -> None:
    obj = mutated(path, replacement, delete)
    check(validate_sidecarset(obj))
    check(validate_sidecarset(obj, old=SAMPLE, others=[SAMPLE, {**SAMPLE, "metadata": {"name": "x"}}]))
    check(validate_sidecarset(SAMPLE, old=obj, others=[{**obj, "metadata": {"name": "x"}}]))


def test_sample_paths_cover_the_whole_sample() -> None:
    assert len(SAMPLE_PATHS) > 150
    assert (
        "spec",
        "containers",
        0,
        "transferEnv",
        1,
        "sourceContainerNameFrom",
        "fieldRef",
        "fieldPath",
    ) in SAMPLE_PATHS
