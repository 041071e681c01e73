"""Manual injection into manifests: find the pod (template) in each object and run the engine on it.

Like `istioctl kube-inject`, workloads are injected in their pod template so that every pod they
create starts out injected (and the webhook, seeing the hash annotation, leaves it alone). Kinds
without a pod template pass through untouched. There is no cluster here, so namespace labels are
whatever the user declares, and an object that names no namespace is not namespace-scoped at all:
`kubectl apply` would put it in a namespace this tool cannot know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from injector import engine
from kuberuntime.jsontypes import JsonObj
from sidecarsets import names
from sidecarsets.model import SidecarSet

# Where each workload kind keeps its pod template.
POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class ManifestError(ValueError):
    """An object that cannot be injected; the message names the object and the field."""


@dataclass(frozen=True, slots=True)
class Context:
    """What manual injection knows: the SidecarSets, the declared namespace labels, and the time."""

    sidecarsets: Sequence[SidecarSet]
    now: str
    # Labels per namespace name; `default_labels` for any namespace not listed; None = unknown.
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    default_labels: Mapping[str, str] | None = None
    manager_namespace: str = names.DEFAULT_MANAGER_NAMESPACE


def scope(namespace: str | None, sidecarsets: Sequence[SidecarSet]) -> tuple[str, tuple[SidecarSet, ...]]:
    """The namespace to inject in and the SidecarSets to use for an object naming `namespace`.

    With no namespace, the SidecarSets' namespace scoping is dropped (the namespace is unknowable)
    and the engine sees `default`.
    """
    if namespace:
        return namespace, tuple(sidecarsets)
    return "default", tuple(dataclasses.replace(ss, namespace_selector=None) for ss in sidecarsets)


def describe(obj: Mapping[str, Any]) -> str:
    """`Kind namespace/name` for messages."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    ns = meta.get("namespace")
    return f"{obj.get('kind') or '(no kind)'} {ns}/{name}" if ns else f"{obj.get('kind') or '(no kind)'} {name}"


def inject_document(doc: Any, ctx: Context) -> tuple[Any, list[str]]:
    """The document with its pod or pod template injected, plus warnings prefixed with the object."""
    if not isinstance(doc, dict):
        raise ManifestError("a document is not an object")
    kind = doc.get("kind")
    if kind == "List":
        items = doc.get("items")
        if items is None:
            return doc, []
        if not isinstance(items, list):
            raise ManifestError(f"{describe(doc)}: items must be a list")
        warnings: list[str] = []
        new_items = []
        for item in items:
            new_item, item_warnings = inject_document(item, ctx)
            new_items.append(new_item)
            warnings += item_warnings
        return {**doc, "items": new_items}, warnings
    if kind == "Pod":
        return _inject_pod(doc, doc, ctx, where=describe(doc), field_prefix="")
    path = POD_TEMPLATE_PATHS.get(str(kind))
    if path is None:
        return doc, []
    template = _at(doc, path)
    if not isinstance(template, dict):
        raise ManifestError(f"{describe(doc)}: {'.'.join(path)} must be an object")
    pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec")}
    prefix = ".".join(path) + "."
    injected, warnings = _inject_pod(pod, doc, ctx, where=describe(doc), field_prefix=prefix)
    if injected is pod:
        return doc, warnings
    new_template = {} if "metadata" in template else {"metadata": injected["metadata"]}
    for key, value in template.items():
        new_template[key] = injected[key] if key in ("metadata", "spec") else value
    return _replaced(doc, path, new_template), warnings


def _inject_pod(
    pod: JsonObj, owner: Mapping[str, Any], ctx: Context, *, where: str, field_prefix: str
) -> tuple[JsonObj, list[str]]:
    meta = owner.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    namespace, sidecarsets = scope(ns if isinstance(ns, str) else None, ctx.sidecarsets)
    result = engine.inject(
        pod,
        namespace=namespace,
        namespace_labels=ctx.namespace_labels.get(namespace, ctx.default_labels),
        sidecarsets=sidecarsets,
        now=ctx.now,
        manager_namespace=ctx.manager_namespace,
        require_namespace_label=False,
    )
    if result.denied is not None:
        raise ManifestError(f"{where}: {field_prefix}{result.denied}")
    warnings = [f"{where}: {w}" for w in result.warnings]
    if not result.patch:
        return pod, warnings
    patched: JsonObj = jsonpatch.apply_patch(pod, result.patch)
    return patched, warnings


def _at(doc: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _replaced(node: JsonObj, path: Sequence[str], value: Any) -> JsonObj:
    """A copy of `node` with `value` at `path`, sharing everything off the path."""
    if not path:
        return value  # type: ignore[no-any-return]
    return {**node, path[0]: _replaced(node[path[0]], path[1:], value)}
