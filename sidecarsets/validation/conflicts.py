"""Conflicts between a SidecarSet and the other SidecarSets that can reach the same pods.

Two SidecarSets that inject into one pod must not both add a container of the same name, the
same volume name with different contents, or fight over an annotation: the pod would be
rejected, or the result would depend on the order of injection. Only SidecarSets whose
namespace scopes and pod selectors can overlap are compared (Kruise's rule: scopes are
disjoint only when both pin namespaces that cannot coincide).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sidecarsets import names, selectors
from sidecarsets.defaults import apply_defaults
from sidecarsets.enums import PatchPolicy
from sidecarsets.validation.base import Errors, FieldError


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> Any:
    metadata = obj.get("metadata")
    return metadata.get("name") if isinstance(metadata, Mapping) else None


def namespace_scope(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The effective namespace selector; None means every namespace.

    `namespace` overrides `namespaceSelector`, as in Kruise's v1alpha1 conversion.
    """
    namespace = spec.get("namespace")
    if isinstance(namespace, str) and namespace:
        return {"matchLabels": {names.NS_NAME_LABEL: namespace}}
    selector = spec.get("namespaceSelector")
    return selector if isinstance(selector, Mapping) else None


def _may_share_pods(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    ns_a, ns_b = namespace_scope(a), namespace_scope(b)
    if ns_a is not None and ns_b is not None and not selectors.overlap(ns_a, ns_b):
        return False
    sel_a, sel_b = a.get("selector"), b.get("selector")
    if not isinstance(sel_a, Mapping) or not isinstance(sel_b, Mapping):
        return False  # a nil selector matches no pod
    return selectors.overlap(sel_a, sel_b)


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


def validate_conflicts(obj: Mapping[str, Any], others: Iterable[Any], errs: Errors) -> None:
    """`obj` is defaulted; `others` are every other SidecarSet as stored (defaulted here)."""
    own_name, spec = _name(obj), _spec(obj)
    for raw in others:
        if not isinstance(raw, Mapping):
            continue
        other = apply_defaults(dict(raw))
        other_name, other_spec = _name(other), _spec(other)
        if other_name == own_name or not _may_share_pods(spec, other_spec):
            continue
        taken = {name for _, name in _containers(other_spec)}
        for path, name in _containers(spec):
            if name in taken:
                errs.append(FieldError(f"{path}.name", f"container {name} already exists in SidecarSet {other_name}"))
        their_volumes = {name: v for _, name, v in _volumes(other_spec)}
        for path, name, volume in _volumes(spec):
            if name in their_volumes and their_volumes[name] != volume:
                errs.append(FieldError(path, f"volume {name} is in conflict with SidecarSet {other_name}"))
        their_keys: dict[str, list[Any]] = {}
        for _, key, policy in _annotations(other_spec):
            their_keys.setdefault(key, []).append(policy)
        for path, key, policy in _annotations(spec):
            if any(PatchPolicy.OVERWRITE in (policy, theirs) for theirs in their_keys.get(key, ())):
                errs.append(FieldError(path, f"annotation {key} is in conflict with SidecarSet {other_name}"))
