"""The differences from Kruise v1.9.1 that the documentation lists (docs/migration/from-kruise.md, "What
differs"; tests/unit/docs checks the list), each recognised by what causes it.

A case whose outputs differ is "documented" only when one of these rules applies to its inputs
*and* every differing path is one the rule explains; anything else is an undocumented difference
and fails the tier. A rule that applies but finds the outputs equal fails too (`test_*` assert it):
the difference it documents is gone, and the documentation's row with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from injector.http.validate.advice import LAUNCH_PRIORITY
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.names import SYSTEM_NAMESPACES


@dataclass(frozen=True)
class InjectCase:
    """One pod through both injectors: our inputs (Kruise gets them mapped) and both outputs."""

    name: str
    pod: dict[str, Any]
    namespace: str
    namespace_labels: dict[str, str]
    sidecarsets: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Rule:
    name: str
    readme: str  # the sentence that documents it (docs/choices.md, or the page named)
    applies: Callable[[InjectCase], bool]
    paths: str  # a regex every differing path must match


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("spec") or {}


def _container_names(ss: dict[str, Any]) -> list[str]:
    return [c.get("name") for key in ("containers", "initContainers") for c in _spec(ss).get(key) or []]


def _selecting(case: InjectCase) -> list[dict[str, Any]]:
    """The SidecarSets whose namespace and selector pick this pod (paused or not)."""
    out = []
    for ss in case.sidecarsets:
        model = SidecarSet.from_object(ss)
        if model.matches_namespace(case.namespace, case.namespace_labels) and model.matches_pod(_labels(case.pod)):
            out.append(ss)
    return out


def _shared_container(case: InjectCase) -> bool:
    seen: set[str] = set()
    for ss in _selecting(case):
        names_here = set(_container_names(ss))
        if names_here & seen:
            return True
        seen |= names_here
    return False


def _merge_into_non_json(case: InjectCase) -> bool:
    have = _annotations(case.pod)
    for ss in case.sidecarsets:
        for entry in _spec(ss).get("patchPodMetadata") or []:
            if entry.get("patchPolicy") != "MergePatchJson":
                continue
            for key in entry.get("annotations") or {}:
                if key in have:
                    try:
                        json.loads(have[key])
                    except ValueError:
                        return True
    return False


def _launch_priority(case: InjectCase) -> bool:
    return any(
        LAUNCH_PRIORITY in (entry.get("annotations") or {})
        for ss in _selecting(case)
        for entry in _spec(ss).get("patchPodMetadata") or []
    )


def _overrides(case: InjectCase) -> bool:
    return names.ANN_OVERRIDES in _annotations(case.pod) and bool(_selecting(case))


def _legacy_hash(case: InjectCase) -> bool:
    raw = _annotations(case.pod).get(names.ANN_HASH)
    return raw is not None and any(isinstance(v, str) for v in json.loads(raw).values())


_INJECTION = (
    r"(metadata\.annotations(\.|$)|metadata\.labels\."
    r"|spec\.(containers|initContainers|volumes|imagePullSecrets)(\[|$))"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "opt-out label",
        'Contract: a pod labelled `sidecarctl.io/inject: "false"` is never injected (Kruise has no opt-out)',
        lambda c: _labels(c.pod).get(names.POD_INJECT_LABEL) == "false",
        _INJECTION,
    ),
    Rule(
        "system namespaces",
        "Choices: pods in the never-injected namespaces (kube-system, kube-public, kube-node-lease and"
        " the manager's own) are allowed untouched (Kruise injects them)",
        lambda c: c.namespace in SYSTEM_NAMESPACES or c.namespace == names.DEFAULT_MANAGER_NAMESPACE,
        _INJECTION,
    ),
    Rule(
        "canary SidecarSets",
        "SidecarSet reference: canary SidecarSets are ours; Kruise v1.9.1 has none and injects base and canary",
        lambda c: any(_annotations(ss).get(names.ANN_CANARY) == "true" for ss in _selecting(c)),
        _INJECTION,
    ),
    Rule(
        "two SidecarSets naming one container",
        "Choices: the older SidecarSet is injected, the other skipped whole (Kruise injects both)",
        _shared_container,
        _INJECTION,
    ),
    Rule(
        "MergePatchJson into an annotation that is not JSON",
        "Choices: left unchanged with a warning (Kruise refuses the pod: `Invalid JSON Document`)",
        _merge_into_non_json,
        r"^(refused|metadata\.annotations\.)",
    ),
    Rule(
        "Container Launch Priority not implemented",
        "Choices: the annotation is written, no KRUISE_CONTAINER_BARRIER env (Kruise adds one to every container)",
        _launch_priority,
        r"^spec\.(containers|initContainers)\[\d+\]\.env$",
    ),
    Rule(
        "hash annotation entries in the old form",
        "Choices: an old `name: hash` entry is kept as it is (Kruise rewrites it as an object)",
        _legacy_hash,
        r"^metadata\.annotations\.sidecarctl\.io/sidecarset-hash(-without-image)?\.",
    ),
    Rule(
        "per-pod overrides",
        "SidecarSet guide, per-pod overrides: `spec.overrides` and the pod annotation `sidecarctl.io/overrides`"
        " are ours; Kruise v1.9.1 has neither and injects the SidecarSet's values",
        _overrides,
        r"^(spec\.(containers|initContainers)\[\d+\]\.(resources|env)(\.|\[|$)"
        r"|metadata\.annotations\.sidecarctl\.io/overrides-env-applied$)",
    ),
    Rule(
        "v1beta1 specificNamespace",
        "SidecarSet reference, Versions: `specificNamespace` is ours; Kruise v1.9.1 has no such field and ignores it",
        lambda c: any("specificNamespace" in _spec(ss) for ss in c.sidecarsets),  # selects by it: not _selecting
        _INJECTION,
    ),
)


def explain(case: InjectCase, paths: Sequence[str]) -> list[Rule]:
    """The rules that apply to `case` and together explain every differing path."""
    rules = [r for r in RULES if r.applies(case)]
    if rules and all(any(re.search(r.paths, p) for r in rules) for p in paths):
        return rules
    return []
