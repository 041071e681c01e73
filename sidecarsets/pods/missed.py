"""Pods that a SidecarSet selects but that run without its sidecars, and the likely reason why.

A pod misses its sidecars when it was admitted without them: created before the SidecarSet (or
before its namespace was labelled for injection), or while the webhook was unreachable with
`failurePolicy: Ignore`, or while its configuration did not match. Nothing in Kubernetes reports
this, and such a pod runs without its proxy until someone notices; the controller looks for them
(sidecarsets.controller.missedscan) and this module says which pods and why, as pure functions of the pods,
the namespaces and the SidecarSets, so `sidecarctl status` can ask the same questions offline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from kuberuntime.jsontypes import mapping, resolve
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

BEFORE_SIDECARSET = "created before the SidecarSet"
BEFORE_NAMESPACE_LABEL = "created before its namespace was labelled for injection"
ADMITTED_WITHOUT = "admitted without injection (webhook unreachable with failurePolicy Ignore, or not called)"


@dataclass(frozen=True)
class MissedPod:
    namespace: str
    name: str
    sidecarset: str
    reason: str
    owned: bool  # a controller (ReplicaSet, StatefulSet, ...) would recreate it

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodFacts:
    """What the check needs of a pod (from a list of pods without the injected label, or from the
    controller's cache for pods injected by other SidecarSets)."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    injected: tuple[str, ...]  # the injected-list annotation
    created: str
    phase: str
    deleting: bool
    owned: bool

    @staticmethod
    def of(pod: Mapping[str, object]) -> PodFacts:
        meta = mapping(pod, "metadata")
        labels = mapping(meta, "labels")
        listed = resolve(meta, "annotations", names.ANN_INJECTED_LIST)
        owners = meta.get("ownerReferences")
        owned = isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("controller") for o in owners)
        return PodFacts(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            labels={k: v for k, v in labels.items() if isinstance(v, str)},
            injected=tuple(n.strip() for n in listed.split(",") if n.strip()) if isinstance(listed, str) else (),
            created=str(meta.get("creationTimestamp") or ""),
            phase=str(resolve(pod, "status", "phase") or ""),
            deleting=meta.get("deletionTimestamp") is not None,
            owned=owned,
        )


def _time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def reason(pod: PodFacts, ss: SidecarSet, *, labelled_at: str | None) -> str:
    """Why `pod` lacks `ss`'s sidecars, as far as the timestamps tell. They have a one-second
    resolution: a pod created in the same second as the SidecarSet (or the label) counts as before
    it, as the webhook had most likely not seen it yet."""
    created = _time(pod.created)
    if created is not None:
        ss_created = _time(ss.creation_timestamp)
        if ss_created is not None and created <= ss_created:
            return BEFORE_SIDECARSET
        labelled = _time(labelled_at or "")
        if labelled is not None and created <= labelled:
            return BEFORE_NAMESPACE_LABEL
    return ADMITTED_WITHOUT


def eligible(pod: PodFacts, *, manager_namespace: str) -> bool:
    """A running pod the webhook would have been asked about."""
    return (
        pod.phase == "Running"
        and not pod.deleting
        and pod.labels.get(names.POD_INJECT_LABEL) != "false"
        and pod.namespace not in names.SYSTEM_NAMESPACES
        and pod.namespace != manager_namespace
    )


def find_missing(
    pods: Iterable[PodFacts],
    sidecarsets: Sequence[SidecarSet],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    manager_namespace: str,
    labelled_at: Mapping[str, str] | None = None,
) -> dict[str, list[MissedPod]]:
    """SidecarSet name -> the pods it selects that lack it, in namespaces labelled for injection.

    A SidecarSet that is paused, has no selector, or is a canary's replaced base for a pod is not
    expected in it; the canary is (sidecarsets.spec.model: `canary_base`)."""
    active = [ss for ss in sidecarsets if not ss.injection_paused and ss.selector]
    out: dict[str, list[MissedPod]] = {ss.name: [] for ss in sidecarsets}
    for pod in pods:
        labels = namespace_labels.get(pod.namespace)
        if labels is None or labels.get(names.NS_INJECTION_LABEL) != names.NS_INJECTION_ENABLED:
            continue
        if not eligible(pod, manager_namespace=manager_namespace):
            continue
        selecting = [ss for ss in active if ss.matches_namespace(pod.namespace, labels) and ss.matches_pod(pod.labels)]
        replaced = {ss.canary_base for ss in selecting if ss.canary_base is not None}
        for ss in selecting:
            if ss.name in replaced or ss.name in pod.injected:
                continue
            why = reason(pod, ss, labelled_at=(labelled_at or {}).get(pod.namespace))
            out[ss.name].append(MissedPod(pod.namespace, pod.name, ss.name, why, pod.owned))
    for found in out.values():
        found.sort(key=lambda m: (m.namespace, m.name))
    return out


def label_time(namespace: Mapping[str, object]) -> str | None:
    """When the injection label was last set on a Namespace object, from its managedFields."""
    fields = resolve(namespace, "metadata", "managedFields")
    latest: str | None = None
    needle = f"f:{names.NS_INJECTION_LABEL}"
    for entry in fields if isinstance(fields, list) else []:
        if not isinstance(entry, Mapping):
            continue
        labels = mapping(entry, "fieldsV1", "f:metadata", "f:labels")
        when = entry.get("time")
        if needle in labels and isinstance(when, str):
            latest = when if latest is None or when > latest else latest
    return latest
