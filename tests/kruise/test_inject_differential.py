"""Kruise's pod webhook (`PodCreateHandler.Handle`, v1.9.1) and ours on the same pods and SidecarSets.

Each case goes through `injector.engine.inject` (the code the webhook and `sidecarctl inject` run) and
through Kruise's handler with a fake client holding the namespace and the SidecarSets as Kruise's
SidecarSet webhook stores them (defaults and hashes). Both pods are compared field by field after
`compare.normalize_pod`; a difference must be one `differences.RULES` documents.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from injector.engine import engine
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.golden_cases import GOLDEN_NOW
from tests.kruise import compare, summary
from tests.kruise.cases import corpus_inject_cases, corpus_pods, corpus_sidecarsets, golden_inject_cases
from tests.kruise.differences import RULES, InjectCase, explain
from tests.kruise.oracle import Oracle

CASES = golden_inject_cases() + corpus_inject_cases()
_MARKS = (names.ANN_INJECTED_BY, "kubectl.kubernetes.io/default-container")


def ours(case: InjectCase) -> dict[str, Any]:
    result = engine.inject(
        case.pod,
        namespace=case.namespace,
        namespace_labels=case.namespace_labels,
        sidecarsets=[SidecarSet.from_object(obj) for obj in case.sidecarsets],
        now=GOLDEN_NOW,
        require_namespace_label=False,
    )
    if result.denied is not None:
        return {"refused": True}
    pod = jsonpatch.apply_patch(case.pod, result.patch)
    # Our marks, which the contract adds to every injected pod and Kruise has no counterpart of.
    meta = pod["metadata"]
    before = case.pod["metadata"]
    if names.POD_INJECTED_LABEL not in (before.get("labels") or {}):
        (meta.get("labels") or {}).pop(names.POD_INJECTED_LABEL, None)
    for key in _MARKS:
        if key not in (before.get("annotations") or {}):
            (meta.get("annotations") or {}).pop(key, None)
    return compare.normalize_pod(pod)


def kruise(oracle: Oracle, case: InjectCase) -> dict[str, Any]:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": case.namespace,
            "labels": {**case.namespace_labels, "kubernetes.io/metadata.name": case.namespace},
        },
    }
    answer = oracle.one(
        {
            "op": "inject",
            "pod": compare.to_kruise_pod(case.pod),
            "namespaces": [namespace],
            "sidecarSets": [compare.to_kruise(obj) for obj in case.sidecarsets],
        }
    )
    assert "error" not in answer, answer["error"]
    if not answer["allowed"]:
        return {"refused": True}
    return compare.normalize_pod(compare.from_kruise_pod(answer["pod"]))


def test_the_corpus_is_large_enough() -> None:
    valid, invalid = corpus_sidecarsets(), corpus_sidecarsets(invalid=True)
    assert len(corpus_pods()) >= 40
    assert len(valid) + len(invalid) >= 30
    assert invalid, "the corpus must hold SidecarSets Kruise refuses"


def differences(oracle: Oracle, case: InjectCase) -> list[tuple[str, Any, Any]]:
    """Where the two injected pods differ; `refused` when only one side refused the pod."""
    mine, theirs = ours(case), kruise(oracle, case)
    if mine.get("refused") != theirs.get("refused"):
        return [("refused", mine.get("refused", False), theirs.get("refused", False))]
    return list(compare.diff(mine, theirs))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_injection_agrees_with_kruise(oracle: Oracle, case: InjectCase) -> None:
    found = differences(oracle, case)
    paths = [p for p, _a, _b in found]
    if not found:
        summary.record("inject", "equal")
        return
    rules = explain(case, paths)
    if not rules:
        summary.record("inject", "undocumented")
        shown = "\n".join(f"  {p}: ours {str(a)[:200]} | kruise {str(b)[:200]}" for p, a, b in found[:12])
        pytest.fail(f"{case.name}: {len(found)} undocumented differences from Kruise v1.9.1:\n{shown}")
    summary.record("inject", "documented: " + " + ".join(r.name for r in rules))


def test_every_documented_difference_still_differs(oracle: Oracle) -> None:
    """Each rule explains at least one real difference: a rule whose difference is gone (we now
    behave as Kruise, or Kruise as we do) must leave `differences.RULES` and the README."""
    seen: set[str] = set()
    for case in CASES:
        paths = [p for p, _a, _b in differences(oracle, case)]
        if paths:
            seen.update(r.name for r in explain(case, paths))
    assert seen == {r.name for r in RULES}
