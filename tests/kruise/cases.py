"""The inputs of the differential tier: every golden injection case, and the corpus of real manifests
(`corpus/`, sources in its README) with every valid corpus SidecarSet in one store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from injector.manifests import manifests
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import validate_sidecarset
from tests.golden_cases import cases as golden_cases
from tests.kruise.differences import InjectCase

CORPUS = Path(__file__).parent / "corpus"


def _docs(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def corpus_pods() -> list[dict[str, Any]]:
    return [d for p in sorted((CORPUS / "pods").glob("*.yaml")) for d in _docs(p)]


def corpus_sidecarsets(*, invalid: bool = False) -> list[tuple[str, dict[str, Any]]]:
    where = CORPUS / "sidecarsets" / ("invalid" if invalid else "")
    return [(p.name, d) for p in sorted(where.glob("*.yaml")) for d in _docs(p)]


def corpus_namespaces() -> dict[str, dict[str, str]]:
    path = CORPUS / "namespaces.yaml"
    docs = _docs(path) if path.exists() else []
    return {ns["metadata"]["name"]: ns["metadata"].get("labels") or {} for ns in docs}


def golden_inject_cases() -> list[InjectCase]:
    out = []
    for case in golden_cases():
        models = [SidecarSet.from_object(obj) for obj in case.sidecarsets]
        for i, (pod, _expected) in enumerate(case.pods()):
            namespace, scoped = manifests.scope(pod["metadata"].get("namespace"), models)
            kept = {m.name for m in scoped}
            out.append(
                InjectCase(
                    name=f"golden/{case.name}/{i}",
                    pod=pod,
                    namespace=namespace,
                    namespace_labels=case.namespace_labels.get(namespace, {}),
                    sidecarsets=[obj for obj in case.sidecarsets if obj["metadata"]["name"] in kept],
                )
            )
    return out


def admitted_by_us(obj: dict[str, Any]) -> bool:
    return not validate_sidecarset(obj)


def corpus_inject_cases() -> list[InjectCase]:
    """Every corpus pod against one store of the corpus SidecarSets both sides admit (one that only
    Kruise admits could never be in ours; `test_validate_differential` covers that difference)."""
    namespaces = corpus_namespaces()
    store = [obj for _name, obj in corpus_sidecarsets() if admitted_by_us(obj)]
    return [
        InjectCase(
            name=f"corpus/{pod['metadata']['name']}",
            pod=pod,
            namespace=pod["metadata"]["namespace"],
            namespace_labels=namespaces.get(pod["metadata"]["namespace"], {}),
            sidecarsets=store,
        )
        for pod in corpus_pods()
    ]
