"""Kruise's SidecarSet conversion (`apis/apps/v1alpha1/sidecarset_conversion.go`, v1.9.1) and ours
(`sidecarsets.spec.conversion.convert`, behind `/convert`), both ways, on every corpus and golden
SidecarSet: v1alpha1 -> v1beta1 from each v1alpha1 object, and v1beta1 -> v1alpha1 from Kruise's
own v1beta1 form of it (and from each v1beta1 object as written).

Compared after dropping what Go's types write for absent fields (empty objects and lists, zero
status counters, `creationTimestamp: null`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any

import pytest

from sidecarsets.spec import names
from sidecarsets.spec.conversion import ConversionError, convert, version_of
from tests.golden_cases import cases as golden_cases
from tests.kruise import compare, summary
from tests.kruise.cases import admitted_by_us, corpus_sidecarsets
from tests.kruise.oracle import Oracle

# Every path where the outputs may differ, with the README section that says why.
DOCUMENTED = (
    (
        "specificNamespace (not a Kruise field)",
        # README, Versions: our earlier v1beta1 shape, still read; Kruise's types drop it.
        r"^spec\.(specificNamespace|namespaceSelector|namespace)$",
    ),
    (
        "sidecarctl's own fields",
        # README, SidecarSet reference: progressDeadlineSeconds and overrides are ours; Kruise's types drop them.
        r"^spec\.(updateStrategy\.progressDeadlineSeconds|overrides)$",
    ),
)


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _clean(v) for k, v in value.items() if k != "creationTimestamp" or v is not None}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _normal(obj: dict[str, Any]) -> dict[str, Any]:
    out = _clean(obj)
    status = {k: v for k, v in (out.get("status") or {}).items() if v != 0}
    out.pop("status", None)
    if status:
        out["status"] = status
    out["apiVersion"] = out["apiVersion"].replace(names.GROUP + "/", names.KRUISE_GROUP + "/")
    assert isinstance(out, dict)
    return out


def _cases() -> list[tuple[str, dict[str, Any]]]:
    """The SidecarSets an API server could store: ours admits them (the invalid corpus holds fields
    misspelled on purpose, which the CRD's schema would prune before any conversion)."""
    out = [(f"corpus/{name}", obj) for name, obj in corpus_sidecarsets() if admitted_by_us(obj)]
    out += [(f"corpus/invalid/{name}", obj) for name, obj in corpus_sidecarsets(invalid=True) if admitted_by_us(obj)]
    for case in golden_cases():
        out += [(f"golden/{case.name}/{obj['metadata']['name']}", obj) for obj in case.sidecarsets]
    # Our spec extensions, which Kruise's types do not have.
    extended = copy.deepcopy(out[0][1])
    extended.setdefault("spec", {}).setdefault("updateStrategy", {})["progressDeadlineSeconds"] = 600
    out.append(("extension/progressDeadlineSeconds", extended))
    overrides = copy.deepcopy(out[0][1])
    sidecar = overrides["spec"]["containers"][0]["name"]
    overrides["spec"]["overrides"] = [{"containerName": sidecar, "resources": {"cpu": {"max": "2"}}, "env": ["L"]}]
    out.append(("extension/overrides", overrides))
    # Edge cases of the custom version, which no manifest above has: an empty one, both ways.
    empty = copy.deepcopy(out[0][1])
    empty.setdefault("metadata", {})["labels"] = {names.SS_LABEL_CUSTOM_VERSION: "", "team": "a"}
    out.append(("edge/empty-custom-version-label", empty))
    beta_empty = {**copy.deepcopy(out[0][1]), "apiVersion": names.API_VERSION_V1BETA1}
    beta_empty["spec"] = {k: v for k, v in beta_empty["spec"].items() if k not in ("namespace", "namespaceSelector")}
    beta_empty["spec"]["customVersion"] = ""
    out.append(("edge/empty-custom-version", beta_empty))
    return out


CASES = _cases()


SEEN: set[str] = set()


def _compare(
    name: str, direction: str, original: dict[str, Any], mine: dict[str, Any], theirs: dict[str, Any]
) -> str | None:
    """None when equal or documented; the rule for spelling only applies to objects that use it."""
    differences = list(compare.diff(_normal(compare.to_kruise(mine)), _normal(theirs)))
    if not differences:
        summary.record("conversion", "equal")
        return None
    if "specificNamespace" not in json.dumps(original):
        documented = [r for r in DOCUMENTED if not r[0].startswith("specificNamespace")]
    else:
        documented = list(DOCUMENTED)
    rules = {r for r, pattern in documented for p, _a, _b in differences if re.search(pattern, p)}
    if all(any(re.search(pattern, p) for _r, pattern in documented) for p, _a, _b in differences):
        SEEN.update(rules)
        summary.record("conversion", "documented: " + " + ".join(sorted(rules)))
        return None
    summary.record("conversion", "undocumented")
    shown = "; ".join(f"{p}: ours {a} | kruise {b}" for p, a, b in differences[:6])
    return f"{name} {direction}: {shown}"


@pytest.mark.parametrize(("name", "obj"), CASES, ids=[c[0] for c in CASES])
def test_conversion_agrees_with_kruise(oracle: Oracle, name: str, obj: dict[str, Any]) -> None:
    kruise_obj = compare.to_kruise(obj)
    ours_obj = compare.from_kruise(obj)  # our group and label names, whichever the case uses
    failures = []
    if version_of(obj.get("apiVersion")) == names.VERSION:
        theirs = oracle.one({"op": "convert", "object": kruise_obj, "to": "v1beta1"})
        assert "error" not in theirs, theirs["error"]
        mine = convert(ours_obj, names.API_VERSION_V1BETA1)
        failures.append(_compare(name, "v1alpha1 -> v1beta1", obj, mine, theirs["object"]))
        beta = theirs["object"]
    else:
        beta = kruise_obj
    theirs = oracle.one({"op": "convert", "object": beta, "to": "v1alpha1"})
    assert "error" not in theirs, theirs["error"]
    try:
        mine = convert(compare.from_kruise(beta), names.API_VERSION)
    except ConversionError as e:  # e.g. a v1beta1 object of our own shape that Kruise cannot read
        mine = {"refused": str(e)}
    failures.append(_compare(name, "v1beta1 -> v1alpha1", obj, mine, theirs["object"]))
    problems = [f for f in failures if f]
    assert not problems, "\n".join(problems)


def test_every_documented_difference_is_still_seen(oracle: Oracle) -> None:
    """Runs every case again (a second of work) so it holds whatever ran before it."""
    SEEN.clear()
    with summary.quiet():
        for name, obj in CASES:
            with contextlib.suppress(AssertionError):  # reported by that test
                test_conversion_agrees_with_kruise(oracle, name, obj)
    assert {r for r, _pattern in DOCUMENTED} == SEEN
