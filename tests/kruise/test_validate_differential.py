"""Kruise's SidecarSet validating webhook (v1.9.1, after its defaulting webhook, as the API server
orders them) and ours (`validate_sidecarset`) on every corpus and golden SidecarSet: admitted by
both or refused by both. Each is validated against the corpus's other valid SidecarSets as the
cluster's existing ones, so conflict checks run too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from sidecarsets.spec import names
from sidecarsets.validation import validate_sidecarset
from tests.golden_cases import cases as golden_cases
from tests.kruise import compare, summary
from tests.kruise.cases import corpus_sidecarsets
from tests.kruise.oracle import Oracle


@dataclass(frozen=True)
class Documented:
    """A SidecarSet one side admits and the other refuses on purpose (README: SidecarSet reference,
    Choices, In-place upgrades). `kruise_says` is in Kruise's refusal; empty when Kruise admits."""

    name: str
    applies: Callable[[dict[str, Any], list[dict[str, Any]]], bool]
    kruise_says: str


def _is_canary(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANN_CANARY) == "true"


_POLICIES = ("Retain", "Overwrite", "MergePatchJson")


def _unknown_patch_policy(obj: dict[str, Any], _others: list[dict[str, Any]]) -> bool:
    entries = (obj.get("spec") or {}).get("patchPodMetadata") or []
    return any(e.get("patchPolicy", "Retain") not in _POLICIES for e in entries)


def _native_sidecar_rolled(obj: dict[str, Any], _others: list[dict[str, Any]]) -> bool:
    spec = obj.get("spec") or {}
    rolling = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate"
    return rolling and any(c.get("restartPolicy") == "Always" for c in spec.get("initContainers") or [])


DOCUMENTED = (
    Documented("unknown patchPolicy refused (Kruise skips the entry)", _unknown_patch_policy, ""),
    Documented(
        "canary SidecarSets (not in Kruise v1.9.1)",
        lambda obj, others: _is_canary(obj) or any(_is_canary(o) for o in others),
        "already exist in",
    ),
    Documented(
        "native sidecars upgraded in place",
        _native_sidecar_rolled,
        "The initContainer in-place upgrade is not currently supported",
    ),
)


def _cases() -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    valid = corpus_sidecarsets()
    out = []
    for name, obj in valid:
        others = [o for n, o in valid if n != name]
        out.append((f"corpus/{name}", obj, others))
    for name, obj in corpus_sidecarsets(invalid=True):
        out.append((f"corpus/invalid/{name}", obj, [o for _n, o in valid]))
    for case in golden_cases():
        for obj in case.sidecarsets:
            if "--no-validate" not in case.args:
                others = [o for o in case.sidecarsets if o is not obj]
                out.append((f"golden/{case.name}/{obj['metadata']['name']}", obj, others))
    return out


CASES = _cases()


def _verdicts(
    oracle: Oracle, obj: dict[str, Any], others: list[dict[str, Any]]
) -> tuple[list[Any], dict[str, Any], Documented | None]:
    """Our errors, Kruise's answer, and the rule that documents a disagreement (None: none does)."""
    ours = validate_sidecarset(obj, others=others)
    theirs = oracle.one(
        {
            "op": "validate",
            "sidecarSet": compare.to_kruise(obj),
            "existing": [compare.to_kruise(o) for o in others],
        }
    )
    assert "error" not in theirs, theirs["error"]
    for rule in DOCUMENTED:
        if not rule.applies(obj, others) or (not ours) == theirs["allowed"]:
            continue
        if rule.kruise_says and not ours and rule.kruise_says in theirs["message"]:
            return ours, theirs, rule
        if not rule.kruise_says and ours and theirs["allowed"]:
            return ours, theirs, rule
    return ours, theirs, None


@pytest.mark.parametrize(("name", "obj", "others"), CASES, ids=[c[0] for c in CASES])
def test_validation_agrees_with_kruise(
    oracle: Oracle, name: str, obj: dict[str, Any], others: list[dict[str, Any]]
) -> None:
    ours, theirs, rule = _verdicts(oracle, obj, others)
    if (not ours) == theirs["allowed"]:
        summary.record("validate", "equal")
        return
    if rule is not None:
        summary.record("validate", "documented: " + rule.name)
        return
    summary.record("validate", "undocumented")
    pytest.fail(
        f"{name}: ours {'admits' if not ours else 'refuses: ' + '; '.join(map(str, ours[:3]))}; "
        f"Kruise {'admits' if theirs['allowed'] else 'refuses: ' + theirs['message']}"
    )


def test_every_documented_disagreement_is_still_seen(oracle: Oracle) -> None:
    """A rule no case needs any more documents a difference that is gone: remove it and its README line."""
    seen = {rule.name for _n, obj, others in CASES if (rule := _verdicts(oracle, obj, others)[2]) is not None}
    assert seen == {r.name for r in DOCUMENTED}
