"""What a new pod would get from a SidecarSet, shown on pods like the ones that run now.

An in-place rollout only swaps images; every other change of a SidecarSet reaches pods when they
are created again. `sidecarctl preview` therefore shows, for one representative pod of each
distinct label set the SidecarSet selects, what the webhook would inject into a new pod like it:
the same engine, the same pin resolution, the other SidecarSets of the cluster beside it. The
representative is rebuilt from a running pod by taking out what injection put in (containers
marked IS_INJECTED, our bookkeeping annotations and label), which is the pod as its workload
submits it, up to what other admission plugins added.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from injector.engine import engine, envs, patchapply
from kuberuntime.jsontypes import JsonObj, mapping, resolve
from sidecarsets import pins
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import hot_pair
from sidecarsets.store import Snapshot

_BOOKKEEPING = (
    names.ANN_HASH,
    names.ANN_HASH_WITHOUT_IMAGE,
    names.ANN_INJECTED_LIST,
    names.ANN_INPLACE_STATE,
    names.ANN_INJECTED_BY,
    names.ANN_WORKING_HOT,
)
_SPEC_DROPPED = ("nodeName",)


def as_submitted(pod: Mapping[str, Any]) -> JsonObj:
    """The pod as its workload would submit it again: injected containers and our bookkeeping out,
    no status, no identity (a new pod of the same template)."""
    meta, spec = mapping(pod, "metadata"), mapping(pod, "spec")
    labels = {k: v for k, v in mapping(meta, "labels").items() if k != names.POD_INJECTED_LABEL}
    annotations = {
        k: v
        for k, v in mapping(meta, "annotations").items()
        if k not in _BOOKKEEPING
        and not k.startswith((names.ANN_VERSION_PREFIX, names.ANN_VERSION_ALT_PREFIX))
        and not k.startswith("sidecarctl.io/sidecarset-")
    }
    new_meta: JsonObj = {"namespace": meta.get("namespace"), "labels": labels, "annotations": annotations}
    if meta.get("generateName"):
        new_meta["generateName"] = meta["generateName"]
    else:
        new_meta["name"] = meta.get("name")
    if isinstance(meta.get("ownerReferences"), list):
        new_meta["ownerReferences"] = copy.deepcopy(meta["ownerReferences"])
    new_spec: JsonObj = {k: copy.deepcopy(v) for k, v in spec.items() if k not in _SPEC_DROPPED}
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        if isinstance(items, list):
            kept = [copy.deepcopy(c) for c in items if not (isinstance(c, Mapping) and envs.is_injected(c))]
            if kept or key == "containers":
                new_spec[key] = kept
            else:
                new_spec.pop(key, None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": new_meta, "spec": new_spec}


@dataclass(frozen=True)
class NewPod:
    """What the webhook would do with a new pod like `example`."""

    namespace: str
    example: str  # the running pod it was rebuilt from
    pods: int  # running pods with the same labels in that namespace
    labels: Mapping[str, str]
    owner: str  # Kind/name of the pod's controller, or ""
    injected: tuple[str, ...]  # the SidecarSets injected
    containers: tuple[tuple[str, str, str], ...]  # (name, image, SidecarSet or "" for the pod's own), in order
    init_containers: tuple[tuple[str, str, str], ...]
    skipped: str | None
    denied: str | None
    warnings: tuple[str, ...]
    pinned: str | None  # the ControllerRevision a pin gives new pods instead of the spec, if any

    def as_json(self) -> JsonObj:
        def listed(items: tuple[tuple[str, str, str], ...]) -> list[JsonObj]:
            return [{"name": n, "image": i, "sidecarSet": s or None} for n, i, s in items]

        return {
            "namespace": self.namespace,
            "example": self.example,
            "pods": self.pods,
            "labels": dict(self.labels),
            "owner": self.owner or None,
            "injected": list(self.injected),
            "containers": listed(self.containers),
            "initContainers": listed(self.init_containers),
            "skipped": self.skipped,
            "denied": self.denied,
            "warnings": list(self.warnings),
            "pinnedRevision": self.pinned,
        }


def _owner(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return f"{ref.get('kind')}/{ref.get('name')}"
    return ""


def representatives(
    ss: SidecarSet, pods: Iterable[Mapping[str, Any]], namespace_labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[Mapping[str, Any], int]]:
    """(the first pod by name, how many share its labels) per namespace and label set `ss` selects."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = mapping(pod, "metadata")
        ns = str(meta.get("namespace") or "")
        labels = {str(k): str(v) for k, v in mapping(meta, "labels").items() if k != names.POD_INJECTED_LABEL}
        if meta.get("deletionTimestamp") or not ss.matches_namespace(ns, namespace_labels.get(ns)):
            continue
        if not ss.matches_pod(labels):
            continue
        groups.setdefault((ns, tuple(sorted(labels.items()))), []).append(pod)
    out: list[tuple[Mapping[str, Any], int]] = []
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda p: str(resolve(p, "metadata", "name") or ""))
        out.append((members[0], len(members)))
    return out


def synthetic_pod(ss: SidecarSet, namespace_labels: Mapping[str, Mapping[str, str]]) -> JsonObj | None:
    """A pod labelled with the selector's matchLabels in the first namespace labelled for injection
    that is in scope, when that pod is selected: what a first workload would get. None otherwise."""
    labels = mapping(ss.selector, "matchLabels")
    if not labels or not all(isinstance(v, str) for v in labels.values()) or not ss.matches_pod(labels):
        return None
    for ns in sorted(namespace_labels):
        ls = namespace_labels[ns]
        enabled = ls.get(names.NS_INJECTION_LABEL) == names.NS_INJECTION_ENABLED
        if enabled and ns not in names.SYSTEM_NAMESPACES and ss.matches_namespace(ns, ls):
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"namespace": ns, "generateName": "example-", "labels": dict(labels)},
                "spec": {"containers": [{"name": "app", "image": "app"}]},
            }
    return None


def _sources(sidecarsets: Sequence[SidecarSet]) -> dict[str, str]:
    """Container name in a pod -> the SidecarSet that puts it there (HotUpgrade pairs included)."""
    out: dict[str, str] = {}
    for ss in sidecarsets:
        for c in (*ss.containers, *ss.init_containers):
            out[c.name] = ss.name
            if c.hot:
                for name in hot_pair(c.name):
                    out[name] = ss.name
    return out


def new_pod(
    pod: JsonObj,
    *,
    target: SidecarSet,
    others: Sequence[SidecarSet],
    namespace_labels: Mapping[str, Mapping[str, str]],
    revisions: Mapping[str, JsonObj],
    now: str,
    manager_namespace: str,
    example: str,
    count: int,
) -> NewPod:
    """Run the webhook's decision on `pod` with `target` in place of the stored SidecarSet of its name.

    A pin (injectionStrategy.revision) is resolved as the webhook resolves it; a Partial pin's
    draw is taken as "the latest spec" (the pod would get the pin only with the partition's odds).
    """
    meta = mapping(pod, "metadata")
    ns = str(meta.get("namespace") or "default")
    labels = {str(k): str(v) for k, v in mapping(meta, "labels").items()}
    ns_labels = namespace_labels.get(ns)
    snapshot = Snapshot(
        sidecarsets=tuple(sorted((target, *(o for o in others if o.name != target.name)), key=lambda s: s.name)),
        namespaces=namespace_labels,
        revisions=revisions,
    )
    candidates, refused = pins.pinned_sidecarsets(
        snapshot, labels, namespace=ns, namespace_labels=ns_labels, rand=lambda: 1.0
    )
    mine = next((c for c in candidates if c.name == target.name), None)
    pinned = None
    if mine is not None and mine.hash != target.hash:
        pinned = str(mine.latest_revision or "a pinned revision")
    base = NewPod(ns, example, count, labels, _owner(meta), (), (), (), None, refused, (), pinned)
    if refused is not None:
        return base
    result = engine.inject(
        pod,
        namespace=ns,
        namespace_labels=ns_labels,
        sidecarsets=candidates,
        now=now,
        manager_namespace=manager_namespace,
    )
    sources = _sources(candidates)
    done = copy.deepcopy(pod)
    if result.patch:
        patchapply.apply_in_place(done, result.patch)
    spec = mapping(done, "spec")
    own = {str(c.get("name")) for key in ("containers", "initContainers") for c in mapping(pod, "spec").get(key) or []}

    def listed(key: str) -> tuple[tuple[str, str, str], ...]:
        return tuple(
            (str(c.get("name")), str(c.get("image") or ""), "" if c.get("name") in own else sources.get(c["name"], "?"))
            for c in spec.get(key) or []
            if isinstance(c, Mapping)
        )

    return NewPod(
        ns,
        example,
        count,
        labels,
        _owner(meta),
        result.injected,
        listed("containers"),
        listed("initContainers"),
        result.skipped,
        result.denied,
        result.warnings,
        pinned,
    )
