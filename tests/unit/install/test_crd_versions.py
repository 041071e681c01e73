"""The CRD's two versions: both served, v1alpha1 stored, converted by the manager's webhook.

The v1beta1 schema is the v1alpha1 one except where the versions differ (sidecarsets.spec.conversion), so
every check tests/unit/install/test_crd_schema.py makes of v1alpha1 holds for v1beta1 too; and a Kruise 1.9
v1beta1 manifest loses nothing to pruning in either of our spellings of the namespace scope.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from sidecarsets.spec import names
from sidecarsets.spec.conversion import convert
from tests.unit.install.test_crd_schema import KRUISE_SAMPLE_YAML, load_crd, root_schema, schema_problems, version_entry

ALPHA_ONLY = {"namespace", "namespaceSelector"}
BETA_ONLY = {"specificNamespace", "namespaceSelector", "customVersion"}


def beta_problems(obj: dict[str, Any]) -> list[str]:
    rest = {k: v for k, v in obj.items() if k != "metadata"}
    return schema_problems(rest, root_schema(names.VERSION_V1BETA1), "")


def kruise_v1beta1() -> dict[str, Any]:
    """The Kruise sample as Kruise 1.9 writes it in v1beta1 (its `namespace` became a selector)."""
    doc: dict[str, Any] = yaml.safe_load(KRUISE_SAMPLE_YAML)
    doc["apiVersion"] = names.API_VERSION_V1BETA1
    spec = doc["spec"]
    spec["namespaceSelector"] = {"matchLabels": {names.NS_NAME_LABEL: spec.pop("namespace")}}
    spec["customVersion"] = "v2"
    return doc


def test_both_versions_are_served_and_v1alpha1_is_stored() -> None:
    entries = {v["name"]: v for v in load_crd()["spec"]["versions"]}
    assert {name: (e["served"], e["storage"]) for name, e in entries.items()} == {
        names.VERSION: (True, True),
        names.VERSION_V1BETA1: (True, False),
    }
    assert all(e["subresources"] == {"status": {}} for e in entries.values())
    assert (
        entries[names.VERSION]["additionalPrinterColumns"] == entries[names.VERSION_V1BETA1]["additionalPrinterColumns"]
    )


def test_conversion_is_the_manager_s_webhook_at_convert() -> None:
    assert load_crd()["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {
                    "namespace": names.DEFAULT_MANAGER_NAMESPACE,
                    "name": "sidecarctl-webhook",
                    "path": names.CONVERT_PATH,
                    "port": 443,
                }
            },
        },
    }, "caBundle must be absent: the manager (or cert-manager's cainjector) fills it"


def test_the_versions_differ_only_where_the_api_does() -> None:
    alpha = copy.deepcopy(root_schema(names.VERSION))
    beta = copy.deepcopy(root_schema(names.VERSION_V1BETA1))
    alpha_spec, beta_spec = alpha["properties"]["spec"], beta["properties"]["spec"]
    assert set(alpha_spec["properties"]) - set(beta_spec["properties"]) == {"namespace"}
    assert set(beta_spec["properties"]) - set(alpha_spec["properties"]) == {"specificNamespace", "customVersion"}
    specific = beta_spec["properties"]["specificNamespace"]
    assert specific["properties"] == {k: alpha_spec["properties"][k] for k in ALPHA_ONLY}
    assert specific["minProperties"] == 1, "an empty specificNamespace says nothing (and cannot be converted)"
    assert (
        beta_spec["properties"]["namespaceSelector"]["properties"]
        == alpha_spec["properties"]["namespaceSelector"]["properties"]
    )
    for key in ALPHA_ONLY:
        alpha_spec["properties"].pop(key)
    for key in BETA_ONLY:
        beta_spec["properties"].pop(key)
    (extra,) = [r for r in beta_spec["x-kubernetes-validations"] if r not in alpha_spec["x-kubernetes-validations"]]
    assert extra["fieldPath"] == ".namespaceSelector" and "mutually exclusive" in extra["message"]
    beta_spec["x-kubernetes-validations"].remove(extra)
    for spec in (alpha_spec, beta_spec):
        spec.pop("description")
    assert alpha == beta


def test_custom_version_must_be_a_label_value() -> None:
    """It becomes the custom-version label in v1alpha1 and on ControllerRevisions."""
    schema = root_schema(names.VERSION_V1BETA1)["properties"]["spec"]["properties"]["customVersion"]
    assert schema["type"] == "string" and schema["maxLength"] == 63
    assert re.search(schema["pattern"], "v1.2-rc_3") and re.search(schema["pattern"], "")
    assert not re.search(schema["pattern"], "-v1") and not re.search(schema["pattern"], "v 1")


def test_a_kruise_v1beta1_manifest_only_needs_its_group_changed() -> None:
    assert beta_problems(kruise_v1beta1()) == []


def test_the_contract_spelling_is_not_pruned_either() -> None:
    obj = kruise_v1beta1()
    obj["spec"]["specificNamespace"] = {"namespace": "shop", "namespaceSelector": obj["spec"].pop("namespaceSelector")}
    assert beta_problems(obj) == []


def test_what_each_version_prunes_is_the_other_version_s_field() -> None:
    """The webhook's validation refuses these by name (the schema alone would drop them silently)."""
    beta = kruise_v1beta1()
    beta["spec"]["namespace"] = "shop"
    assert beta_problems(beta) == [".spec.namespace: pruned (not in the schema)"]


def test_converted_objects_fit_the_schema_of_their_version() -> None:
    beta = kruise_v1beta1()
    alpha = convert(beta, names.API_VERSION)
    rest = {k: v for k, v in alpha.items() if k != "metadata"}
    assert schema_problems(rest, root_schema(names.VERSION), "") == []
    assert beta_problems(convert(alpha, names.API_VERSION_V1BETA1)) == []
    assert version_entry(names.VERSION)["storage"] is True
