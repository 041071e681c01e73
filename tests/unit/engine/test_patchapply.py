"""injector.engine.patchapply gives what jsonpatch gives for every patch the engine emits."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from injector.engine import engine, patchapply
from injector.manifests import manifests
from sidecarsets.spec.model import SidecarSet
from tests.golden_cases import GOLDEN_NOW, cases

POD_CASES = [c for c in cases() if c.has_pods]


@pytest.mark.parametrize("case", POD_CASES, ids=[c.name for c in POD_CASES])
def test_same_result_as_jsonpatch_on_the_golden_pods(case: object) -> None:
    from tests.golden_cases import GoldenCase

    assert isinstance(case, GoldenCase)
    sidecarsets = [SidecarSet.from_object(obj) for obj in case.sidecarsets]
    for pod, _ in case.pods():
        namespace, scoped = manifests.scope(pod["metadata"].get("namespace"), sidecarsets)
        result = engine.inject(
            pod,
            namespace=namespace,
            namespace_labels=case.namespace_labels.get(namespace),
            sidecarsets=scoped,
            now=GOLDEN_NOW,
            require_namespace_label=False,
        )
        mine = copy.deepcopy(pod)
        patchapply.apply_in_place(mine, copy.deepcopy(result.patch))
        assert mine == jsonpatch.apply_patch(pod, result.patch)


def test_operations_and_escapes() -> None:
    doc = {"a": {"x/y": 1, "t~": [0, 1]}, "l": [1, 2]}
    patchapply.apply_in_place(
        doc,
        [
            {"op": "add", "path": "/a/x~1y", "value": 2},
            {"op": "add", "path": "/a/t~0/0", "value": -1},
            {"op": "add", "path": "/l/-", "value": 3},
            {"op": "replace", "path": "/l/0", "value": 9},
            {"op": "remove", "path": "/a/t~0/1"},
            {"op": "add", "path": "/new", "value": {}},
        ],
    )
    assert doc == {"a": {"x/y": 2, "t~": [-1, 1]}, "l": [9, 2, 3], "new": {}}


@pytest.mark.parametrize(
    "op",
    [
        {"op": "add", "path": "/l/5", "value": 0},
        {"op": "add", "path": "/l/01", "value": 0},
        {"op": "replace", "path": "/missing", "value": 0},
        {"op": "remove", "path": "/missing"},
        {"op": "add", "path": "/nope/x", "value": 0},
        {"op": "move", "path": "/l/0", "from": "/l/1"},
        {"op": "add", "path": "", "value": 0},
        {"op": "add", "path": "l", "value": 0},
        {"op": "add", "path": "/s/x", "value": 0},
    ],
)
def test_operations_that_do_not_fit_raise(op: dict[str, object]) -> None:
    with pytest.raises(patchapply.PatchError):
        patchapply.apply_in_place({"l": [1], "s": "text"}, [op])
