"""What makes a NamespacedSidecarSet safe to hand to a namespace's admins: the rules a SidecarSet
does not have.

A tenant's sidecar runs inside the tenant's pods, so it may do no more than a pod its owner could
create there: its namespace's Pod Security `enforce` level is always applied to it (a SidecarSet
only warns, unless annotated), hostPath included; and it may not take a container, init container
or volume name from a cluster SidecarSet that can inject the same pods (the cluster's sidecar must
win in every pod). The right to create pods there is checked by the webhook (a SubjectAccessReview:
I/O, not here). Pure functions of the model and the namespace's labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import podsecurity
from sidecarsets.validation.base import Errors, FieldError

_SCOPE_FIELDS = ("namespaceSelector", "namespace", "specificNamespace")


def refusal_for_namespace(namespace: str, labels: Mapping[str, str] | None, *, manager_namespace: str) -> str | None:
    """Why no NamespacedSidecarSet may live in `namespace` (None: it may); `labels` None: unknown."""
    if namespace in names.SYSTEM_NAMESPACES or namespace == manager_namespace:
        return f"namespace {namespace} never gets sidecars (a system namespace or the manager's own)"
    if labels is None:
        return f"namespace {namespace} does not exist or its labels cannot be read"
    if names.namespaced_sidecarsets_disabled(labels):
        label = f"{names.NS_NAMESPACED_SIDECARSETS_LABEL}={names.NS_NAMESPACED_SIDECARSETS_DISABLED}"
        return f"namespace {namespace} is labelled {label}: {names.NAMESPACED_KIND}s are turned off there"
    return None


def validate_shape(obj: Mapping[str, Any], errs: Errors) -> None:
    """The fields a NamespacedSidecarSet may not have: its scope is its own namespace, its one
    version v1beta1, and a revision pin (kept in the manager's namespace) is not served for it."""
    api_version = obj.get("apiVersion")
    if api_version is not None and api_version != names.API_VERSION_V1BETA1:
        errs.append(FieldError("apiVersion", f"a {names.NAMESPACED_KIND} is {names.API_VERSION_V1BETA1} only"))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return
    for field in _SCOPE_FIELDS:
        if spec.get(field) is not None:
            errs.append(
                FieldError(
                    f"spec.{field}",
                    f"a {names.NAMESPACED_KIND} selects pods of its own namespace only (by spec.selector)",
                )
            )
    strategy = spec.get("injectionStrategy")
    if isinstance(strategy, Mapping) and strategy.get("revision") is not None:
        errs.append(
            FieldError(
                "spec.injectionStrategy.revision", f"not supported for a {names.NAMESPACED_KIND}: new pods get the spec"
            )
        )


def pod_security_refusal(ss: SidecarSet, labels: Mapping[str, str]) -> str | None:
    """Why the namespace's enforced Pod Security level refuses these sidecars (hostPath included), or None.

    Always enforced for this kind: a tenant may not put into its pods what it could not put into a pod."""
    level = podsecurity.namespace_policy(labels)["enforce"]
    found = podsecurity.violations(ss, level)
    if not found:
        return None
    details = "; ".join(str(v) for v in found)
    return f'namespace {ss.namespace} enforces PodSecurity "{level}", which these sidecars violate: {details}'


def may_share_pods(tenant: SidecarSet, cluster: SidecarSet, labels: Mapping[str, str] | None) -> bool:
    """Whether `cluster` (a SidecarSet) can inject pods `tenant` selects: it reaches the tenant's
    namespace (judged on the labels when known; unknown labels count as reaching it) and the two pod
    selectors can overlap."""
    if cluster.namespaced or tenant.selector is None or cluster.selector is None:
        return False
    if labels is not None and not cluster.matches_namespace(tenant.namespace, labels):
        return False
    return selectors.overlap(tenant.selector, cluster.selector)


def cluster_clashes(
    tenant: SidecarSet, sidecarsets: Iterable[SidecarSet], labels: Mapping[str, str] | None
) -> list[tuple[str, str, str]]:
    """(what, name, cluster SidecarSet) for each container, init container or volume name of `tenant`
    that a cluster SidecarSet able to inject the same pods owns; sorted."""
    out: set[tuple[str, str, str]] = set()
    for other in sidecarsets:
        if not may_share_pods(tenant, other, labels):
            continue
        theirs = other.all_names_in_pod
        for c in tenant.containers + tenant.init_containers:
            what = "init container" if c in tenant.init_containers else "container"
            out.update((what, n, other.name) for n in tenant.names_in_pod(c.name) if n in theirs)
        their_volumes = {v["name"] for v in other.volumes}
        out.update(("volume", v["name"], other.name) for v in tenant.volumes if v["name"] in their_volumes)
    return sorted(out)


def clash_message(clashes: list[tuple[str, str, str]]) -> str:
    return "; ".join(f"{what} {name} belongs to SidecarSet {owner}" for what, name, owner in clashes)


def conflict_condition(clashes: list[tuple[str, str, str]]) -> dict[str, str]:
    """The NamespacedSidecarSet's ClusterSidecarSetConflict condition: True while a cluster SidecarSet
    (created after it was admitted) owns some of its names, so its pods get the cluster's sidecar
    and not this one."""
    if not clashes:
        return {
            "type": names.CONDITION_CLUSTER_CONFLICT,
            "status": "False",
            "reason": "NoConflict",
            "message": "no cluster SidecarSet injecting the same pods owns one of its names",
        }
    return {
        "type": names.CONDITION_CLUSTER_CONFLICT,
        "status": "True",
        "reason": "ClusterSidecarSetWins",
        "message": "not injected where these cluster SidecarSets inject (a cluster SidecarSet wins its names): "
        + clash_message(clashes),
    }
