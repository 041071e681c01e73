"""The NamespacedSidecarSet CRD as generated: namespaced, one version and so nothing to convert, and
SidecarSet v1beta1's spec without the fields that would let it reach beyond its namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sidecarsets.spec import names

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "config" / "crd" / f"{names.GROUP}_{names.NAMESPACED_PLURAL}.yaml"
SS_CRD = REPO / "config" / "crd" / "sidecarctl.io_sidecarsets.yaml"


def load(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(path.read_text())
    return found


def test_namespaced_one_version_no_conversion() -> None:
    crd = load(CRD)
    assert crd["metadata"]["name"] == names.NAMESPACED_CRD_NAME
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == names.NAMESPACED_KIND
    assert crd["spec"]["names"]["plural"] == names.NAMESPACED_PLURAL
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (names.VERSION_V1BETA1, True, True)
    assert version["subresources"] == {"status": {}}
    assert "conversion" not in crd["spec"]  # one version: the API server converts nothing


def test_spec_is_sidecarsets_v1beta1_without_namespace_fields_and_same_columns() -> None:
    [version] = load(CRD)["spec"]["versions"]
    beta = next(v for v in load(SS_CRD)["spec"]["versions"] if v["name"] == names.VERSION_V1BETA1)
    ours = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    theirs = beta["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(theirs) - set(ours) == {"namespaceSelector", "specificNamespace"}
    assert set(ours) <= set(theirs)
    assert ours["containers"] == theirs["containers"]
    assert version["additionalPrinterColumns"] == beta["additionalPrinterColumns"]
