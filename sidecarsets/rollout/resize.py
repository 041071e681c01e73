"""Sidecar CPU and memory rolled into running pods through `pods/resize`, decided before any write.

A SidecarSet change that touches only its sidecars' images and `resources` (or `resourcesPolicy`)
reaches running pods: images by the in-place patch (sidecarsets.rollout.podpatch), CPU and memory by
a `pods/resize` patch, under the same rollout rules (sidecarsets.rollout.planner). Whether a pod was
injected from such a spec is read from its without-image hash: the specs the SidecarSet had
(its ControllerRevisions) whose hash with images *and* resources blanked equals the current one
are listed by `resizable_hashes`.

What the API server or the kubelet would refuse is refused here first, so a pod is never half
changed: a resource other than CPU or memory, a request or limit removed, a memory limit lowered
where the container's resizePolicy does not restart it, or a QoS class change. Such a pod stays
not upgradable, with the reason.

The wanted values follow injection: a sidecar's own `resources` (a limit without a request gets
the limit as its request, as the API server defaults a pod), or, with a `resourcesPolicy`, the
values computed from the pod's own containers (sidecarsets.spec.resourcespolicy); then the pod's
own overrides (sidecarsets.overrides) replace the fields they name, so a SidecarSet change resizes
only what the pod does not override. An override outside the SidecarSet's bounds, or a request
above its limit after merging, is refused like any other change the API server would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.overrides import annotation, merge
from sidecarsets.pods.podrecords import Resources
from sidecarsets.pods.projection import PodProjection
from sidecarsets.pods.resizestate import RESIZABLE, same_quantity, same_values
from sidecarsets.rollout.podpatch import without_image_op
from sidecarsets.spec import hashing
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.resourcespolicy import ResourcesPolicyError, computed_resources
from sidecarsets.spec.sidecar import SidecarContainer
from sidecarsets.values import quantity

if TYPE_CHECKING:
    from sidecarsets.rollout.planner import PodUpgrade

NOT_REQUIRED = "NotRequired"
# Where discovery lists the subresource (Kubernetes 1.33 and later, unless InPlacePodVerticalScaling is
# turned off before 1.35, where it went GA): without it a resources change is not rolled to running pods.
RESIZE_SUBRESOURCE = ("v1", "pods/resize")
NOT_SERVED = "this API server does not serve pods/resize (InPlacePodVerticalScaling is off): recreate the pod"


@dataclass(frozen=True)
class ResizeStep:
    """One sidecar container's new CPU and memory."""

    container: str
    field: str  # "containers" or "initContainers"
    index: int  # its position in that list of the pod's spec
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]

    def resources(self) -> JsonObj:
        out: JsonObj = {}
        if self.requests:
            out["requests"] = dict(self.requests)
        if self.limits:
            out["limits"] = dict(self.limits)
        return out


@dataclass(frozen=True)
class ResizeDecision:
    """The steps that bring a pod's sidecars to the SidecarSet's resources, or why it cannot be done."""

    steps: tuple[ResizeStep, ...] = ()
    refusal: str = ""


def resizable_hashes(ss: SidecarSet, specs: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Without-image hashes of the `specs` (the SidecarSet's revisions) that differ from the
    current spec in nothing but images and resources: pods injected from one can be resized."""
    return frozenset(
        hashing.spec_hash_without_image(spec)
        for spec in specs
        if hashing.spec_hash_without_image_and_resources(spec) == ss.hash_without_resources
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _section(resources: Mapping[str, Any], key: str) -> dict[str, str]:
    return {str(k): _text(v) for k, v in mapping(resources, key).items()}


def _pod_spec(pod: PodProjection) -> JsonObj:
    """The pod's containers as injection saw them, as far as resources go (for resourcesPolicy)."""

    def container(r: Resources) -> JsonObj:
        c: JsonObj = {"name": r.name, "resources": {"requests": dict(r.requests), "limits": dict(r.limits)}}
        if r.native:
            c["restartPolicy"] = "Always"
        return c

    return {
        "containers": [container(r) for r in pod.resources if not r.init],
        "initContainers": [container(r) for r in pod.resources if r.init],
    }


def wanted(
    sc: SidecarContainer, pod: PodProjection, ss: SidecarSet | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """(requests, limits) the SidecarSet asks for this sidecar in this pod, the pod's overrides merged.

    Raises ResourcesPolicyError when a resourcesPolicy cannot be computed for the pod, OverrideError
    (with `ss`, whose bounds apply) when the pod's override of it is refused."""
    if sc.resources_policy is not None:
        injected = frozenset(n for entry in pod.hashes for n in entry.sidecar_list)
        resources: Mapping[str, Any] = computed_resources(sc.resources_policy, _pod_spec(pod), injected)
    else:
        resources = mapping(sc.container, "resources")
    override = override_of(pod, sc.name)
    if override is not None and override.has_resources:
        resources = merge.merged_resources(resources, override)
        if ss is not None:
            merge.check(ss, override)
            merge.check_request_limits(ss, override, resources)
    requests, limits = _section(resources, "requests"), _section(resources, "limits")
    for resource, value in limits.items():  # the API server's defaulting of a pod
        requests.setdefault(resource, value)
    return requests, limits


def override_of(pod: PodProjection, container: str) -> annotation.ContainerOverride | None:
    """The pod's override of `container`, when its annotation holds one (and can be read)."""
    if pod.overrides is None:
        return None
    found = annotation.parsed(pod.overrides)
    return found.get(container) if isinstance(found, annotation.PodOverrides) else None


def _quantity(value: str) -> quantity.Quantity | None:
    try:
        return quantity.parse(value)
    except quantity.QuantityError:
        return None


def _refusal(sc: SidecarContainer, current: Resources, requests: dict[str, str], limits: dict[str, str]) -> str:
    """Why the API server would refuse this container's change ("" when it would take it)."""
    for section, have, want in (
        ("requests", dict(current.requests), requests),
        ("limits", dict(current.limits), limits),
    ):
        for resource in sorted(set(have) | set(want)):
            if resource not in RESIZABLE and not same_quantity(have.get(resource), want.get(resource)):
                return f"{sc.name}: resources.{section}.{resource} cannot change in a running pod (only cpu and memory)"
            if resource in have and resource not in want:
                return f"{sc.name}: resources.{section}.{resource} would be removed, which a running pod cannot do"
    old, new = dict(current.limits).get("memory"), limits.get("memory")
    policy = dict(current.resize_policy).get("memory") or NOT_REQUIRED
    if old is not None and new is not None and policy == NOT_REQUIRED:
        before, after = _quantity(old), _quantity(new)
        if before is not None and after is not None and after.cmp(before) < 0:
            return (
                f"{sc.name}: its memory limit would go down ({old} to {new}) with resizePolicy "
                f"{NOT_REQUIRED}; give the sidecar resizePolicy memory: RestartContainer to allow it"
            )
    return ""


def decide(ss: SidecarSet, pod: PodProjection) -> ResizeDecision:
    """The resize steps that bring `pod`'s sidecars to `ss`'s resources (none when they have them)."""
    steps: list[ResizeStep] = []
    after = {r.name: r for r in pod.resources}
    positions = {name: ("containers", i) for i, (name, _) in enumerate(pod.containers)}
    positions |= {name: ("initContainers", i) for i, (name, _) in enumerate(pod.init_containers)}
    for sc in (*ss.containers, *(c for c in ss.init_containers if c.native)):
        current = pod.resources_of(sc.name)
        try:
            requests, limits = wanted(sc, pod, ss)
        except ResourcesPolicyError as e:
            return ResizeDecision(refusal=f"{sc.name}: resourcesPolicy: {e}")
        except annotation.OverrideError as e:
            return ResizeDecision(refusal=str(e))
        unchanged = current is not None and same_values(current.requests, requests.items())
        if unchanged and current is not None and same_values(current.limits, limits.items()):
            continue
        if sc.hot or current is None or sc.name not in positions:
            return ResizeDecision(refusal=f"{sc.name}: not one container in the pod (HotUpgrade pairs are not resized)")
        refusal = _refusal(sc, current, requests, limits)
        if refusal:
            return ResizeDecision(refusal=refusal)
        field, index = positions[sc.name]
        step = ResizeStep(sc.name, field, index, tuple(sorted(requests.items())), tuple(sorted(limits.items())))
        steps.append(step)
        after[sc.name] = current._replace(requests=step.requests, limits=step.limits)
    if steps and pod.container_statuses and not pod.applied_resources:
        # The API server refuses to resize a running pod whose containers report no resources.
        return ResizeDecision(refusal="its node reports no container resources: a kubelet before 1.33 cannot resize")
    if steps:
        old_qos, new_qos = qos_class(pod.resources), qos_class(after.values())
        if old_qos != new_qos:
            return ResizeDecision(refusal=f"the pod's QoS class would change from {old_qos} to {new_qos}")
    return ResizeDecision(tuple(steps))


def qos_class(containers: Iterable[Resources]) -> str:
    """Kubernetes' QoS class from CPU and memory (core/v1 helper GetPodQOS, without pod-level resources)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        for pairs, totals in ((c.requests, requests), (c.limits, limits)):
            for resource, value in pairs:
                q = _quantity(value) if resource in RESIZABLE else None
                if q is not None and q.sign() > 0:
                    totals[resource] = totals.get(resource, 0) + q.milli_value()
        limited = {r for r, v in c.limits if r in RESIZABLE and (q := _quantity(v)) is not None and q.sign() > 0}
        if limited != set(RESIZABLE):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests.keys() == limits.keys() and all(limits[r] == v for r, v in requests.items()):
        return "Guaranteed"
    return "Burstable"


def resize_patch(pod: PodProjection, steps: Sequence[ResizeStep]) -> list[JsonObj]:
    """The JSON Patch for `pods/resize`: guarded by the pod's resourceVersion and each container's
    name at its index, so a pod that changed since it was observed is not resized by position."""
    ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}]
    for step in steps:
        base = f"/spec/{step.field}/{step.index}"
        ops.append({"op": "test", "path": f"{base}/name", "value": step.container})
        # Section by section: anything else in `resources` (claims) stays as it is.
        ops += [
            {"op": "add", "path": f"{base}/resources/{section}", "value": values}
            for section, values in step.resources().items()
        ]
    return ops


def resize_record(upgrade: PodUpgrade, annotation: str | None, *, now: str) -> JsonObj:
    """The operation recording a resized pod's new without-image hash, from the pod's annotation as
    it is now (sidecarsets.rollout.podpatch.without_image_op)."""
    return without_image_op(
        annotation,
        ss_name=upgrade.sidecarset,
        new_hash=upgrade.without_image_hash,
        sidecars=list(upgrade.sidecars),
        now=now,
    )
