"""Conflicts between a SidecarSet and the other SidecarSets that can reach the same pods.

Two SidecarSets that inject into one pod must not both add a container of the same name, the
same volume name with different contents, or fight over an annotation: the pod would be
rejected, or the result would depend on the order of injection. Only SidecarSets whose
namespace scopes and pod selectors can overlap are compared (Kruise's rule: scopes are
disjoint only when both pin namespaces that cannot coincide).

A canary and its base never reach the same pod together (the canary replaces the base), so
they are not compared: the canary usually defines the very same containers. Names are compared
as the pod gets them too: a HotUpgrade `envoy` is injected as `envoy-1` and `envoy-2`, so another
SidecarSet's `envoy-1` clashes with it. Kruise skips the
base only when the canary is validated, so that a later edit of the base is refused for
clashing with its own canary; here the pair is skipped both ways.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kuberuntime.jsontypes import mapping
from sidecarsets.spec import selectors
from sidecarsets.spec.enums import PatchPolicy
from sidecarsets.spec.model import SidecarSet, object_key
from sidecarsets.validation.base import Errors, FieldError


def _may_share_pods(a: SidecarSet, b: SidecarSet) -> bool:
    ns_a, ns_b = a.namespace_selector, b.namespace_selector
    if ns_a is not None and ns_b is not None and not selectors.overlap(ns_a, ns_b):
        return False
    if a.selector is None or b.selector is None:
        return False  # a nil selector matches no pod
    return selectors.overlap(a.selector, b.selector)


def _containers(spec: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if isinstance(c, Mapping) and isinstance(c.get("name"), str):
                yield f"spec.{key}[{i}]", c["name"]


def _volumes(spec: Mapping[str, Any]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    items = spec.get("volumes")
    for i, v in enumerate(items if isinstance(items, list) else []):
        if isinstance(v, Mapping) and isinstance(v.get("name"), str):
            yield f"spec.volumes[{i}]", v["name"], v


def _annotations(spec: Mapping[str, Any]) -> Iterable[tuple[str, str, Any]]:
    items = spec.get("patchPodMetadata")
    for i, patch in enumerate(items if isinstance(items, list) else []):
        if not isinstance(patch, Mapping) or not isinstance(patch.get("annotations"), Mapping):
            continue
        for key in patch["annotations"]:
            yield f"spec.patchPodMetadata[{i}].annotations[{key}]", str(key), patch.get("patchPolicy")


def validate_conflicts(
    obj: Mapping[str, Any], others: Iterable[Any], errs: Errors, *, models: Mapping[str, SidecarSet] | None = None
) -> None:
    """`obj` is defaulted; `others` are every other SidecarSet as stored (read through the model).
    `models`: the models already read from them, by name (the webhook's store keeps them): reading a
    thousand SidecarSets again for every admission took longer than the API server waits.

    The fields of `obj` are walked as JSON so each error names the field by its index.
    """
    own = SidecarSet.from_object(obj, tolerant=True)
    spec = mapping(obj, "spec")
    for raw in others:
        if not isinstance(raw, Mapping):
            continue
        meta = raw.get("metadata")
        known = (models or {}).get(object_key(raw)) if isinstance(meta, Mapping) else None
        other = known if known is not None and known.obj is raw else SidecarSet.from_object(raw, tolerant=True)
        if other.name == own.name or own.canary_base == other.name or other.canary_base == own.name:
            continue
        if not _may_share_pods(own, other):
            continue
        theirs = other.all_names_in_pod
        for path, name in _containers(spec):
            if name in other.all_container_names:
                errs.append(FieldError(f"{path}.name", f"container {name} already exists in SidecarSet {other.name}"))
                continue
            # A HotUpgrade sidecar takes its -1/-2 pair of names in the pod: those clash too.
            clash = [n for n in own.names_in_pod(name) if n in theirs]
            if clash:
                errs.append(
                    FieldError(
                        f"{path}.name",
                        f"container {name} takes the name {clash[0]} in a pod, as a container of SidecarSet "
                        f"{other.name} does (a HotUpgrade sidecar is injected as its -1 and -2 pair)",
                    )
                )
        their_volumes = {v["name"]: v for v in other.volumes}
        for path, name, volume in _volumes(spec):
            if name in their_volumes and their_volumes[name] != volume:
                errs.append(FieldError(path, f"volume {name} is in conflict with SidecarSet {other.name}"))
        their_keys: dict[str, list[Any]] = {}
        for patch in other.patch_pod_metadata:
            for key, _ in patch.annotations:
                their_keys.setdefault(key, []).append(patch.policy)
        for path, key, policy in _annotations(spec):
            if any(PatchPolicy.OVERWRITE in (policy, theirs) for theirs in their_keys.get(key, ())):
                errs.append(FieldError(path, f"annotation {key} is in conflict with SidecarSet {other.name}"))
