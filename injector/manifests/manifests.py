"""Manual injection into manifests: find the pod (template) in each object and run the engine on it.

Like `istioctl kube-inject`, workloads are injected in their pod template so that every pod they
create starts out injected (and the webhook, seeing the hash annotation, leaves it alone). Kinds
are matched by API group and kind: a Deployment of `apps` is a workload, an OpenKruise
`apps.kruise.io` StatefulSet or CloneSet is not, unless the caller adds its template path (the
CLI's `--kind-template`); an unknown kind that embeds a pod template passes through with a
warning that says so. There is no cluster here, so namespace labels are whatever the caller
declares, and an object that names no namespace (and is given none) is not namespace-scoped at
all: `kubectl apply` would put it in a namespace this tool cannot know.

Revision pins and the timestamps of hash entries are decided as injector.manifests.manifestpins says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from injector.engine import eligibility, engine, envs, patchapply
from injector.manifests.manifestcontext import WORKLOAD_TEMPLATES, Context, ManifestError, Stats, TemplateKey
from injector.manifests.manifestpins import EPOCH, pinned_sidecarsets, stamp
from kuberuntime.jsontypes import JsonObj, mapping, resolve
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet

_BUILTIN_GROUP = {kind: group for group, kind in WORKLOAD_TEMPLATES}
_SIDECARSET_GROUPS = frozenset({names.GROUP, names.KRUISE_API_VERSION.split("/")[0]})
_SEARCH_DEPTH = 5


def api_group(obj: Mapping[str, Any]) -> str | None:
    """The object's API group ("" for core), or None when it has no apiVersion."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        return None
    group, sep, _ = api_version.rpartition("/")
    return group if sep else ""


def template_key(obj: Mapping[str, Any]) -> TemplateKey:
    """(group, kind); an object without apiVersion is taken to be of its kind's built-in group."""
    kind = str(obj.get("kind") or "")
    group = api_group(obj)
    return (_BUILTIN_GROUP.get(kind, "") if group is None else group, kind)


def scope(namespace: str | None, sidecarsets: Sequence[SidecarSet]) -> tuple[str, tuple[SidecarSet, ...]]:
    """The namespace to inject in and the SidecarSets to use for an object naming `namespace`.

    With no namespace, the SidecarSets' namespace scoping is dropped (the namespace is unknowable)
    and the engine sees `default`.
    """
    if namespace:
        return namespace, tuple(sidecarsets)
    return "default", tuple(_unscoped(ss) for ss in sidecarsets)


def _unscoped(ss: SidecarSet) -> SidecarSet:
    return ss if ss.namespace_selector is None else dataclasses.replace(ss, namespace_selector=None)


def describe(obj: Mapping[str, Any]) -> str:
    """`Kind namespace/name` for messages."""
    meta = mapping(obj, "metadata")
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    ns = meta.get("namespace")
    kind = obj.get("kind") or "(no kind)"
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def inject_document(doc: Any, ctx: Context) -> tuple[Any, Stats]:
    """The document with its pod or pod template injected (the same object when untouched)."""
    stats = Stats()
    return _document(doc, ctx, stats), stats


def _document(doc: Any, ctx: Context, stats: Stats) -> Any:
    if not isinstance(doc, dict):
        raise ManifestError("the document is not an object (a mapping of apiVersion, kind, metadata, ...)")
    key = template_key(doc)
    if key == ("", "List"):
        items = doc.get("items")
        if items is None:
            return doc
        if not isinstance(items, list):
            raise ManifestError(f"{describe(doc)}: items must be a list")
        new_items = []
        for i, item in enumerate(items):
            try:
                new_items.append(_document(item, ctx, stats))
            except ManifestError as e:
                raise ManifestError(f"items[{i}]: {e}") from None
        if all(new is old for new, old in zip(new_items, items, strict=True)):
            return doc
        return {**doc, "items": new_items}
    path = ctx.templates.get(key)
    if path is None:
        _note_unknown_kind(doc, key, ctx)
        return doc
    if path == ():
        return _inject_pod(doc, doc, ctx, stats, field_prefix="")
    template = _at(doc, path)
    if not isinstance(template, dict):
        raise ManifestError(f"{describe(doc)}: {'.'.join(path)} must be an object")
    pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec")}
    injected = _inject_pod(pod, doc, ctx, stats, field_prefix=".".join(path) + ".")
    if injected is pod:
        return doc
    new_template = {} if "metadata" in template else {"metadata": injected["metadata"]}
    for k, value in template.items():
        new_template[k] = injected[k] if k in ("metadata", "spec") else value
    return _replaced(doc, path, new_template)


def _note_unknown_kind(doc: Mapping[str, Any], key: TemplateKey, ctx: Context) -> None:
    group, kind = key
    if kind == names.KIND and group in _SIDECARSET_GROUPS:
        return
    found = find_pod_template(doc)
    if found is None:
        return
    where = ".".join(found)
    qualified = f"{kind}.{group}" if group else kind
    ctx.notes.add(
        f"kind {kind} of API group {group or 'core'} is not a workload this tool knows, but it holds a pod template "
        f"at {where}: passed through unchanged (inject it with --kind-template {qualified}={where})",
        describe(doc),
    )


def find_pod_template(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The path of the first nested object shaped like a pod template ({spec: {containers: [...]}}).

    The object itself does not count (a SidecarSet has `spec.containers` too), nor its status.
    """
    todo: list[tuple[tuple[str, ...], Mapping[str, Any]]] = [((), obj)]
    while todo:
        path, node = todo.pop(0)
        for key, value in node.items():
            if not isinstance(value, Mapping) or (not path and key == "status"):
                continue
            here = (*path, str(key))
            spec = value.get("spec")
            if isinstance(spec, Mapping) and isinstance(spec.get("containers"), list):
                return here
            if len(here) < _SEARCH_DEPTH:
                todo.append((here, value))
    return None


def _inject_pod(pod: JsonObj, owner: Mapping[str, Any], ctx: Context, stats: Stats, *, field_prefix: str) -> JsonObj:
    where = describe(owner)
    own_ns = resolve(owner, "metadata", "namespace")
    ns = own_ns if isinstance(own_ns, str) and own_ns else ctx.default_namespace
    namespace, scoped = scope(ns, ctx.sidecarsets)
    ns_labels = ctx.labels_of(namespace) if ns else None
    pod_labels = mapping(pod, "metadata", "labels")
    candidates, stamps = pinned_sidecarsets(
        scoped, ctx, pod_labels=pod_labels, namespace=namespace, ns_labels=ns_labels, where=where
    )
    if ns is None:
        candidates = [_unscoped(ss) for ss in candidates]
    stats.pods += 1
    result = engine.inject(
        pod,
        namespace=namespace,
        namespace_labels=ns_labels,
        sidecarsets=candidates,
        now=ctx.now or EPOCH,
        manager_namespace=ctx.manager_namespace,
        require_namespace_label=False,
    )
    if result.denied is not None:
        raise ManifestError(f"{where}: {field_prefix}{result.denied}")
    for warning in result.warnings:
        ctx.notes.add(warning, where)
    if result.skipped == eligibility.SKIP_SYSTEM_NAMESPACE:
        what = "the manager's (--manager-namespace)" if namespace == ctx.manager_namespace else "a system namespace"
        ctx.notes.add(f"namespace {namespace} is {what}, never injected: left unchanged", where)
        return pod
    if ns is not None and ns_labels is None:
        _note_unknown_labels(scoped, namespace, pod_labels, ctx, where)
    if result.skipped == engine.SKIP_ALREADY_INJECTED:
        stats.already += 1
    elif result.skipped in (engine.SKIP_NO_MATCH, engine.SKIP_ALL_CONFLICT):
        stats.unmatched += 1
    if not result.patch:
        return pod
    stats.injected += 1
    if ns is None:
        _note_unscoped(result.injected, ctx, where)
    _note_replaced(pod, result.injected, ctx, where)
    patched = _own_copy(pod)
    patchapply.apply_in_place(patched, result.patch)
    if ctx.now is None:
        stamp(patched, result.injected, stamps, ctx)
    return patched


def _note_unknown_labels(
    sidecarsets: Sequence[SidecarSet], namespace: str, pod_labels: Mapping[str, str], ctx: Context, where: str
) -> None:
    missed = sorted(
        ss.name
        for ss in sidecarsets
        if ss.namespace_selector is not None
        and not ss.injection_paused
        and ss.matches_pod(pod_labels)
        and not ss.matches_namespace(namespace, None)
        and _name_allows(ss.namespace_selector, namespace)
    )
    if missed:
        ctx.notes.add(
            f"the labels of namespace {namespace} are not known, so SidecarSets that select namespaces by label "
            f"were not matched: {', '.join(missed)} (give its Namespace object with -f or --sidecarset, "
            f"or --namespace-labels {namespace}:KEY=VALUE)",
            where,
        )


def _name_allows(selector: Mapping[str, Any], namespace: str) -> bool:
    """Whether the selector's requirements on the namespace name label let `namespace` through,
    so that its labels could decide (otherwise the name alone excludes it: nothing to warn about)."""
    match_labels = selector.get("matchLabels")
    expressions = selector.get("matchExpressions")
    on_name = {
        "matchLabels": {k: v for k, v in match_labels.items() if k == names.NS_NAME_LABEL}
        if isinstance(match_labels, Mapping)
        else {},
        "matchExpressions": [e for e in expressions if isinstance(e, Mapping) and e.get("key") == names.NS_NAME_LABEL]
        if isinstance(expressions, list)
        else [],
    }
    try:
        return selectors.matches(on_name, {names.NS_NAME_LABEL: namespace})
    except (ValueError, TypeError):
        return False


def _note_unscoped(injected: Sequence[str], ctx: Context, where: str) -> None:
    scoped = sorted(n for n in injected if (ss := ctx.sidecarset(n)) is not None and ss.namespace_selector is not None)
    if scoped:
        ctx.notes.add(
            f"no namespace (no metadata.namespace, no -n): SidecarSets that select namespaces were matched on "
            f"their pod selector alone: {', '.join(scoped)} (give -n NAMESPACE to match them as in that namespace)",
            where,
        )


def _note_replaced(pod: Mapping[str, Any], injected: Sequence[str], ctx: Context, where: str) -> None:
    """A sidecar that takes the place of an app container of the same name (Kruise replaces it)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    for list_key in ("containers", "initContainers"):
        own = {c.get("name") for c in spec.get(list_key) or () if isinstance(c, Mapping) and not envs.is_injected(c)}
        if not own:
            continue
        for name in injected:
            ss = ctx.sidecarset(name)
            if ss is None:
                continue
            init = list_key == "initContainers"
            for sc in ss.init_containers if init else ss.containers:
                for taken in sc.names_in_pod:  # a HotUpgrade pair takes two names
                    if taken in own:
                        ctx.notes.add(
                            f"{ss.kind} {ss.name}: its container {taken} replaces the pod's own container "
                            f"of that name in spec.{list_key}",
                            where,
                        )


def _own_copy(pod: JsonObj) -> JsonObj:
    """A copy sharing nothing with the parsed document, aliases included (YAML `*ref` shares objects)."""
    try:
        copied: JsonObj = orjson.loads(orjson.dumps(pod))
        return copied
    except TypeError:  # not JSON (a non-string key, !!binary): copy node by node
        return _tree_copy(pod)  # type: ignore[no-any-return]


def _tree_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tree_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree_copy(v) for v in value]
    return value


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
