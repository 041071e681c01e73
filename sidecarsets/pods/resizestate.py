"""Where a pod's in-place resize stands: applied, still under way, or refused by its node.

Since Kubernetes 1.35 a container's CPU and memory can change on a running pod through the
`pods/resize` subresource. The API server takes the new values into the pod's spec at once; the
kubelet applies them when it can and reports what it applied in `status.containerStatuses[].resources`,
with a `PodResizePending` condition (reason `Deferred`: not now, `Infeasible`: never on this node)
or `PodResizeInProgress` while it works. A sidecar counts as resized once the kubelet reports the
spec's values and no such condition is left.

Quantities are compared by value (`1Gi` and `1024Mi` are one value): the API server writes a pod's
quantities in canonical form, a SidecarSet keeps what its author wrote.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sidecarsets.pods.podrecords import Resources
from sidecarsets.pods.projection import PodProjection
from sidecarsets.values import quantity

RESIZABLE = ("cpu", "memory")  # the only resources a running container's spec may change
PENDING = "PodResizePending"
IN_PROGRESS = "PodResizeInProgress"
INFEASIBLE = "Infeasible"


def same_quantity(a: str | None, b: str | None) -> bool:
    """Two quantity strings with the same value; an unparsable one equals only itself."""
    if a is None or b is None:
        return a is b
    if a == b:
        return True
    try:
        return quantity.parse(a).cmp(quantity.parse(b)) == 0
    except quantity.QuantityError:
        return False


def same_values(a: Iterable[tuple[str, str]], b: Iterable[tuple[str, str]]) -> bool:
    """The same resources with the same values ((resource, quantity) pairs)."""
    left, right = dict(a), dict(b)
    return left.keys() == right.keys() and all(same_quantity(v, right[k]) for k, v in left.items())


def covered(spec: Resources, applied: Resources) -> bool:
    """The kubelet reports every CPU and memory value the spec sets (it may report more: defaults)."""
    got_requests, got_limits = dict(applied.requests), dict(applied.limits)
    for wanted, got in ((spec.requests, got_requests), (spec.limits, got_limits)):
        for resource, value in wanted:
            if resource in RESIZABLE and not same_quantity(value, got.get(resource)):
                return False
    return True


def infeasible(pod: PodProjection) -> str | None:
    """The kubelet's message when it says this pod's resize can never fit its node."""
    for kind, reason, message in pod.resize_conditions:
        if kind == PENDING and reason == INFEASIBLE:
            return message or "the node cannot fit the new resources"
    return None


def applied(pod: PodProjection, containers: Collection[str]) -> bool:
    """Every one of `containers` runs with the CPU and memory its spec asks for, as far as the
    kubelet reports: no resize pending or in progress, reported values equal to the spec's. A
    container the kubelet reports no resources for gives no evidence against."""
    if pod.resize_conditions:
        return False
    for name in containers:
        spec, got = pod.resources_of(name), pod.resources_of(name, applied=True)
        if spec is not None and got is not None and not covered(spec, got):
            return False
    return True


def as_json(requests: Iterable[tuple[str, str]], limits: Iterable[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """A container's `resources` object from (resource, quantity) pairs; empty sections left out."""
    out: dict[str, dict[str, str]] = {}
    for section, pairs in (("requests", dict(requests)), ("limits", dict(limits))):
        if pairs:
            out[section] = pairs
    return out
