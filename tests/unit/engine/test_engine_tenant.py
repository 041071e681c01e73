"""The engine with NamespacedSidecarSets: its own namespace only, after the cluster's sidecars, never
over a cluster SidecarSet's container, and keyed `<namespace>/<name>` in every annotation so that a
tenant's `mesh` and the cluster's `mesh` are two SidecarSets in one pod."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from injector.engine import engine
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

NOW = "2026-12-05T10:00:00Z"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


def model(obj: dict[str, Any]) -> SidecarSet:
    return SidecarSet.from_object({**obj, "metadata": {**obj["metadata"], "creationTimestamp": "2026-01-01T00:00:00Z"}})


def inject(
    *sets: SidecarSet, namespace: str = "team-a", labels: dict[str, str] | None = None
) -> engine.InjectionResult:
    labels = {**ENABLED, names.NS_NAME_LABEL: namespace, **(labels or {})}
    return engine.inject(builders.pod(), namespace=namespace, namespace_labels=labels, sidecarsets=sets, now=NOW)


def patched(result: engine.InjectionResult) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(builders.pod(), result.patch)
    return out


def test_a_namespaced_sidecarset_is_keyed_by_namespace_and_name() -> None:
    tenant = model(builders.namespaced_sidecarset("mesh", containers=[builders.container("log", "log:1")]))
    assert (tenant.name, tenant.object_name, tenant.namespace, tenant.kind) == (
        "team-a/mesh",
        "mesh",
        "team-a",
        names.NAMESPACED_KIND,
    )


def test_it_injects_only_pods_of_its_own_namespace() -> None:
    tenant = model(builders.namespaced_sidecarset("mesh", containers=[builders.container("log", "log:1")]))
    assert inject(tenant).injected == ("team-a/mesh",)
    assert inject(tenant, namespace="team-b").patch == []


def test_the_disabled_label_stops_its_injection() -> None:
    tenant = model(builders.namespaced_sidecarset("mesh", containers=[builders.container("log", "log:1")]))
    labels = {names.NS_NAMESPACED_SIDECARSETS_LABEL: names.NS_NAMESPACED_SIDECARSETS_DISABLED}
    assert inject(tenant, labels=labels).patch == []


def test_same_name_cluster_and_namespaced_sets_are_both_injected_cluster_first() -> None:
    # The tenant's set is older and sorts first by name: the cluster's still comes first.
    tenant = model(builders.namespaced_sidecarset("mesh", containers=[builders.container("log", "log:1")]))
    cluster = SidecarSet.from_object(
        builders.sidecarset("mesh", metadata={"creationTimestamp": "2026-06-01T00:00:00Z"})
    )
    result = inject(tenant, cluster)
    pod = patched(result)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["proxy", "log", "app"]
    annotations = pod["metadata"]["annotations"]
    hashes = json.loads(annotations[names.ANN_HASH])
    assert set(hashes) == {"mesh", "team-a/mesh"}
    assert hashes["team-a/mesh"]["sidecarList"] == ["log"] and hashes["mesh"]["sidecarList"] == ["proxy"]
    assert annotations[names.ANN_INJECTED_LIST] == "mesh,team-a/mesh"


def test_cluster_sidecars_come_before_the_namespaces_own() -> None:
    tenant = model(builders.namespaced_sidecarset("a", containers=[builders.container("log", "log:1")]))
    cluster = SidecarSet.from_object(builders.sidecarset("z", metadata={"creationTimestamp": "2026-06-01T00:00:00Z"}))
    names_in_order = [c["name"] for c in patched(inject(tenant, cluster))["spec"]["containers"]]
    assert names_in_order.index("proxy") < names_in_order.index("log")


def test_a_cluster_sidecarset_wins_a_container_name_whatever_its_age() -> None:
    tenant = model(builders.namespaced_sidecarset("debug", containers=[builders.container("proxy", "mine:1")]))
    cluster = SidecarSet.from_object(
        builders.sidecarset("mesh", metadata={"creationTimestamp": "2026-06-01T00:00:00Z"})
    )
    result = inject(tenant, cluster)
    assert result.injected == ("mesh",)
    [proxy] = [c for c in patched(result)["spec"]["containers"] if c["name"] == "proxy"]
    assert proxy["image"] == "proxy:1"
    assert any("team-a/debug is not injected" in w and "a cluster SidecarSet" in w for w in result.warnings)


def test_a_sidecarset_manifest_carrying_a_namespace_is_still_a_cluster_sidecarset() -> None:
    obj = builders.sidecarset("mesh", metadata={"namespace": "shop"})
    ss = SidecarSet.from_object(obj)
    assert (ss.name, ss.namespace, ss.kind) == ("mesh", "", names.KIND)
