"""The tenant rules as pure functions: which cluster SidecarSet owns a NamespacedSidecarSet's names in
its pods (admission refuses such a name; the controller reports one a later cluster set took), and
the condition its owners read."""

from __future__ import annotations

from typing import Any

from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import tenancy
from tests.kube import builders

LABELS = {names.NS_NAME_LABEL: "team-a", "env": "dev"}


def tenant(*containers: str, volumes: list[dict[str, Any]] | None = None) -> SidecarSet:
    sidecars = [builders.container(c, "x:1") for c in containers]
    obj = builders.namespaced_sidecarset("logs", containers=sidecars, volumes=volumes or [])
    return SidecarSet.from_object(obj)


def cluster(name: str, *containers: str, **kw: Any) -> SidecarSet:
    return SidecarSet.from_object(
        builders.sidecarset(name, containers=[builders.container(c, "y:1") for c in containers], **kw)
    )


def test_a_cluster_set_reaching_the_namespace_owns_its_names() -> None:
    clashes = tenancy.cluster_clashes(tenant("proxy", "log"), [cluster("mesh", "proxy")], LABELS)
    assert clashes == [("container", "proxy", "mesh")]
    assert tenancy.clash_message(clashes) == "container proxy belongs to SidecarSet mesh"


def test_volume_names_count_too() -> None:
    vol = {"name": "certs", "emptyDir": {}}
    clashes = tenancy.cluster_clashes(tenant("log", volumes=[vol]), [cluster("mesh", "proxy", volumes=[vol])], LABELS)
    assert clashes == [("volume", "certs", "mesh")]


def test_cluster_sets_that_cannot_reach_its_pods_own_nothing_there() -> None:
    elsewhere = cluster("mesh", "proxy", namespace_selector={"matchLabels": {"env": "prod"}})
    other_pods = cluster("db", "proxy", app="db")
    assert tenancy.cluster_clashes(tenant("proxy"), [elsewhere, other_pods], LABELS) == []
    # Unknown labels: the namespace selector might match, so the name stays the cluster's.
    assert tenancy.cluster_clashes(tenant("proxy"), [elsewhere], None) == [("container", "proxy", "mesh")]


def test_the_condition_names_each_name_and_owner() -> None:
    quiet = tenancy.conflict_condition([])
    assert (quiet["type"], quiet["status"]) == (names.CONDITION_CLUSTER_CONFLICT, "False")
    loud = tenancy.conflict_condition([("container", "proxy", "mesh")])
    assert loud["status"] == "True" and loud["reason"] == "ClusterSidecarSetWins"
    assert "container proxy belongs to SidecarSet mesh" in loud["message"]


def test_namespace_refusals() -> None:
    disabled = {names.NS_NAMESPACED_SIDECARSETS_LABEL: names.NS_NAMESPACED_SIDECARSETS_DISABLED}
    assert tenancy.refusal_for_namespace("team-a", LABELS, manager_namespace="sidecarctl-system") is None
    assert "disabled" in str(tenancy.refusal_for_namespace("team-a", disabled, manager_namespace="m"))
    assert "does not exist" in str(tenancy.refusal_for_namespace("team-a", None, manager_namespace="m"))
    assert "never gets sidecars" in str(tenancy.refusal_for_namespace("m", LABELS, manager_namespace="m"))
