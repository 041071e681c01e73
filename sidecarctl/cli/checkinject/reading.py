"""What check-inject reads, GET and LIST only: the pods, every SidecarSet, the namespaces, our
MutatingAdmissionPolicies and, only when a pod carries an outdated sidecar, the injected pods and
ControllerRevisions that place it in its rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread
from sidecarctl.cli.checkinject import paths, state
from sidecarctl.cli.checkinject.target import WORKLOADS, Target
from sidecarctl.cli.checkinject.verdicts import Cluster
from sidecarctl.cli.clierror import CliError
from sidecarsets.pods.projection import project
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet

if TYPE_CHECKING:
    from kuberuntime import kubeapi
    from sidecarsets.rollout.glance import Glance

POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"


async def _pods(client: kubeapi.KubeClient, target: Target) -> list[tuple[JsonObj, str | None]]:
    """(pod, None) for each pod to check, or the workload's template as (would-be pod, "kind/name")."""
    ns, name = target.namespace, target.name
    if target.kind == "pod":
        pod = await clusterread.get_or_none(client, f"/api/v1/namespaces/{ns}/pods/{name}")
        if pod is None:
            raise CliError(f"pod {ns}/{name} not found")
        return [(pod, None)]
    if target.kind == "selector":
        found = await clusterread.list_all(client, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": name})
        if not found:
            raise CliError(f"no pod in namespace {ns} matches -l {name}")
        return [(p, None) for p in sorted(found, key=lambda p: str(p["metadata"].get("name")))]
    workload = await clusterread.get_or_none(client, WORKLOADS[target.kind].format(ns=ns, name=name))
    if workload is None:
        raise CliError(f"{target.kind} {ns}/{name} not found")
    spec = workload.get("spec") or {}
    selector = spec.get("selector")
    labels = (selector or {}).get("matchLabels") or {}
    params: dict[str, str | int] = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
    listed = await clusterread.list_all(client, f"/api/v1/namespaces/{ns}/pods", params)
    mine = [p for p in listed if selectors.matches(selector, (p.get("metadata") or {}).get("labels") or {})]
    if mine:
        return [(p, None) for p in sorted(mine, key=lambda p: str(p["metadata"].get("name")))]
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or {}
    meta = template.get("metadata") or {}
    would_be: JsonObj = {
        "metadata": {**meta, "namespace": ns, "name": f"{target.kind}/{name}"},
        "spec": template.get("spec") or {"containers": []},
    }
    return [(would_be, f"{target.kind}/{name}")]


async def gather(
    client: kubeapi.KubeClient, target: Target, *, manager_namespace: str, now: str
) -> tuple[list[tuple[JsonObj, str | None]], Cluster]:
    import asyncio

    async def sidecarsets() -> list[JsonObj]:
        """Every SidecarSet, and the NamespacedSidecarSets of the pods' namespace (where served)."""
        cluster, tenants = await asyncio.gather(
            clusterread.list_all(client, clusterread.SS_PATH),
            clusterread.list_optional(client, clusterread.tenant_path(target.namespace)),
        )
        return [*cluster, *(tenants or [])]

    pods, sets, namespaces, policies = await asyncio.gather(
        _pods(client, target),
        sidecarsets(),
        clusterread.list_all(client, "/api/v1/namespaces"),
        clusterread.list_optional(client, POLICIES, {"labelSelector": "app.kubernetes.io/managed-by=sidecarctl"}),
    )
    models = sorted((SidecarSet.from_object(o, tolerant=True) for o in sets), key=lambda s: s.name)
    members = paths.policy_members(policies or [])
    cluster = Cluster(models, namespaces, manager_namespace, {ss.name: paths.route_of(ss, members) for ss in models})
    projected = [project(p) for p, template in pods if template is None]
    late = {ss.name: [p for p in projected if state.outdated(ss, p, cluster.labels.get(p.namespace))] for ss in models}
    if any(late.values()):
        injected, revs = await asyncio.gather(
            clusterread.list_optional(client, "/api/v1/pods", {"labelSelector": f"{names.POD_INJECTED_LABEL}=true"}),
            clusterread.revisions_of(client, sets, manager_namespace),
        )
        rollout = None if injected is None else _RolloutInputs(injected, cluster.labels, revs, now, manager_namespace)
        for ss in models:
            if late[ss.name] and rollout is not None:
                glance = rollout.glance(ss)
                for p in late[ss.name]:
                    key = f"{p.namespace}/{p.name}"
                    cluster.held[(ss.name, key)] = state.why_outdated(key, glance)
    return pods, cluster


class _RolloutInputs:
    """The cluster's injected pods, projected once, and what `sidecarctl status` needs beside them."""

    def __init__(
        self,
        injected: list[JsonObj],
        ns_labels: dict[str, dict[str, str]],
        revs: list[JsonObj],
        now: str,
        manager_namespace: str,
    ) -> None:
        from sidecarsets.pods.podkeys import pod_key

        self.raw = {pod_key(p): p for p in injected}
        self.projections = [project(p) for p in injected]
        self.ns_labels = ns_labels
        self.revs, self.now, self.manager_namespace = revs, now, manager_namespace

    def glance(self, ss: SidecarSet) -> Glance:
        """The SidecarSet's rollout as `sidecarctl status` shows it."""
        from sidecarsets.rollout import glance

        mine = clusterread.revisions_for(ss, self.revs, self.manager_namespace)
        return glance.of(
            ss, self.projections, self.raw, self.ns_labels, stored_revisions=mine, missing=[], now=self.now
        )
