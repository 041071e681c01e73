"""The injection engine: (pod, namespace, SidecarSets) → RFC 6902 operations, with no I/O.

The webhook and the CLI both call `inject`, so a pod injected by hand and a pod injected at
admission are the same pod. Semantics are OpenKruise's SidecarSet webhook, with these choices
where Kruise leaves a gap:

* SidecarSets are applied in Kruise's group order, those its namespace index finds (scoped by
  namespace name) before the cluster-wide ones, and by name within each (Kruise's cache order there
  is arbitrary);
* two matching SidecarSets that define the same container name: the older one (creationTimestamp,
  then name) is injected and the other is skipped whole, with a warning naming both (Kruise relies
  on its validating webhook and would otherwise emit a pod the API server rejects);
* a pod whose hash annotation already records a SidecarSet at its current hash is not injected
  again by it, so re-invocation and repeated admission are no-ops.

As in Kruise, a canary SidecarSet that selects the pod replaces its base for that pod (the base is
dropped before anything else is decided), and a sidecar with a resourcesPolicy gets resources
computed from the pod's containers (sidecarsets.spec.resourcespolicy); a policy that cannot be applied refuses
the pod. A pod's `sidecarctl.io/overrides` annotation is read once (a malformed one refuses the
pod), each container's override is checked against its SidecarSet's `spec.overrides` and merged
into that sidecar (sidecarsets.overrides): one refused override refuses the pod, naming every refused
one; an override of a container no SidecarSet injects here is ignored with a warning; the env
values applied are recorded on the pod. A HotUpgrade sidecar is built as a cold one and then split
into the pair `<n>-1` / `<n>-2` with its version and working annotations (injector.engine.hotupgrade);
the hash annotations still list it by its own name.

The clock is read by the caller and passed in `now`, which keeps the function pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from injector.engine import (
    build,
    eligibility,
    envs,
    hotupgrade,
    metadata,
    patchops,
    placement,
    podcheck,
    selection,
    volumes,
)
from kuberuntime.jsontypes import JsonObj, is_object
from sidecarsets.overrides import annotation, merge
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

SKIP_NO_MATCH = selection.SKIP_NO_MATCH
SKIP_ALREADY_INJECTED = selection.SKIP_ALREADY_INJECTED
SKIP_ALL_CONFLICT = selection.SKIP_ALL_CONFLICT


@dataclass(frozen=True, slots=True)
class InjectionResult:
    """What to do with a pod: `patch` (possibly empty) plus why, when nothing is done.

    `denied` is set only for a pod too malformed to inject into, or whose overrides are refused
    (`refusal` then says why, in one of sidecarsets.overrides.annotation.REASONS); the caller rejects it.
    """

    patch: list[JsonObj]
    injected: tuple[str, ...] = ()
    skipped: str | None = None
    warnings: tuple[str, ...] = ()
    denied: str | None = None
    refusal: str | None = None
    overrides: tuple[merge.Outcome, ...] = ()  # each override of the pod: applied, refused or ignored


def inject(
    pod: JsonObj,
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    sidecarsets: Sequence[SidecarSet],
    now: str,
    operation: str = "CREATE",
    manager_namespace: str = names.DEFAULT_MANAGER_NAMESPACE,
    require_namespace_label: bool = True,
) -> InjectionResult:
    """Decide and build the injection of `sidecarsets` into `pod` (which is never modified).

    `namespace` is the request's namespace ("" means `default`); `namespace_labels` None means
    unknown. `now` is the RFC 3339 time recorded in the hash annotations.
    """
    namespace = namespace or "default"
    if not is_object(pod):
        return InjectionResult(patch=[], denied="the pod must be a JSON object")
    reason = eligibility.skip_reason(
        pod,
        namespace=namespace,
        namespace_labels=namespace_labels,
        operation=operation,
        manager_namespace=manager_namespace,
        require_namespace_label=require_namespace_label,
    )
    if reason is not None:
        return InjectionResult(patch=[], skipped=reason)
    problem = podcheck.pod_problem(pod)
    if problem is not None:
        return InjectionResult(patch=[], denied=problem)

    meta: Mapping[str, Any] = pod.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec: Mapping[str, Any] = pod["spec"]
    warnings: list[str] = []
    selected = selection.select(
        sidecarsets, namespace=namespace, namespace_labels=namespace_labels, pod=pod, warnings=warnings
    )
    if isinstance(selected, str):
        return InjectionResult(patch=[], skipped=selected, warnings=tuple(warnings))
    todo, hash_maps = selected.todo, selected.hash_maps
    apps = build.Apps(spec["containers"], spec=spec, sidecar_names=selected.sidecar_names)
    done = _build(todo, meta, spec, apps, warnings)
    if isinstance(done, InjectionResult):
        return done
    built, outcomes, overrides = done
    # Kruise sorts the injected init containers of all SidecarSets together, by name.
    built.init_containers.sort(key=lambda item: str(item[1]["name"]))
    new_labels = {**labels, names.POD_INJECTED_LABEL: "true"}
    new_annotations = _annotations(
        annotations, todo, hash_maps, built, apps, now=now, warnings=warnings, replaced=selected.replaced
    )
    _record_env(new_annotations, overrides, outcomes)
    ops = _metadata_ops(pod, new_labels, new_annotations)
    drop = _left_by_replaced_bases(spec, annotations, sidecarsets, selected.replaced, built)
    spec_ops = _spec_ops(spec, built, drop=drop)
    if isinstance(spec_ops, str):
        # The selection compares sidecars by their own names, so only a HotUpgrade pair can get
        # here (`<n>-1` also named by another SidecarSet, or by an init container of the pod when
        # `<n>` is a container); kept so that the API server is never sent such a pod.
        return InjectionResult(patch=[], denied=f"injection would duplicate container name {spec_ops}")
    # Every object in `ops` is already the patch's own (see `build._sidecar` and the model's `fresh_*`).
    injected = tuple(ss.name for ss in todo)
    return InjectionResult(patch=ops + spec_ops, injected=injected, warnings=tuple(warnings), overrides=outcomes)


def _build(
    todo: Sequence[SidecarSet], meta: Mapping[str, Any], spec: Mapping[str, Any], apps: build.Apps, warnings: list[str]
) -> tuple[build.Built, tuple[merge.Outcome, ...], annotation.PodOverrides] | InjectionResult:
    """The sidecars built with the pod's overrides, and what became of each override; or the
    refusal (a malformed annotation, a refused override, a resourcesPolicy that cannot apply)."""
    raw = (meta.get("annotations") or {}).get(names.ANN_OVERRIDES)
    # Read once per distinct text: the replicas of a workload carry the same one.
    overrides = annotation.parsed(raw) if isinstance(raw, str) or raw is None else annotation.parse_error(raw)
    if isinstance(overrides, annotation.OverrideError):
        return InjectionResult(patch=[], warnings=tuple(warnings), denied=str(overrides), refusal=overrides.reason)
    try:
        built = build.sidecars(
            todo,
            pod_metadata=meta,
            containers=spec["containers"],
            apps=apps,
            volumes_in_pod=spec.get("volumes") or [],
            overrides=overrides,
        )
    except build.Refused as e:
        return InjectionResult(patch=[], denied=str(e))
    warnings.extend(built.warnings)
    outcomes = _override_outcomes(overrides, built)
    refused = [o for o in outcomes if o.verdict == merge.REFUSED]
    if refused:
        denied = "; ".join(o.message for o in refused)
        return InjectionResult([], (), None, tuple(warnings), denied, refused[0].reason, outcomes)
    warnings.extend(o.message for o in outcomes if o.verdict == merge.IGNORED)
    return built, outcomes, overrides


def _record_env(
    annotations: dict[str, str], overrides: annotation.PodOverrides, outcomes: Sequence[merge.Outcome]
) -> None:
    """The env values the applied overrides gave the sidecars, recorded on every pod that asks for
    overrides (`{}` when none; a record a pod came with is emptied, the patch only adds): a running
    container cannot take a changed one, which the controller reports by comparing the two
    annotations, and the record keeps the pod's resizes in the controller's care after the annotation
    is removed (its sidecars then go back to the SidecarSet's values)."""
    record = annotation.env_record(overrides, (o.container for o in outcomes if o.verdict == merge.APPLIED))
    if record is not None or names.ANN_OVERRIDES in annotations or names.ANN_OVERRIDES_ENV_APPLIED in annotations:
        annotations[names.ANN_OVERRIDES_ENV_APPLIED] = record or "{}"


def _override_outcomes(overrides: annotation.PodOverrides, built: build.Built) -> tuple[merge.Outcome, ...]:
    """Each container override of the pod: as the build judged it, or ignored when no SidecarSet
    injected here has that sidecar (a removed SidecarSet must not break a template still asking)."""
    if not overrides.containers:
        return ()
    judged = {o.container: o for o in built.overrides}  # every sidecar of `todo` was built
    return tuple(judged.get(c.container) or merge.ignored(c) for c in overrides.containers)


_HashMaps = selection.HashMaps


def _annotations(
    annotations: Mapping[str, str],
    todo: Sequence[SidecarSet],
    hash_maps: _HashMaps,
    built: build.Built,
    apps: build.Apps,
    *,
    now: str,
    warnings: list[str],
    replaced: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """The pod's annotations after injection: patchPodMetadata, hash maps, injected list, default container."""
    hash_map, hash_map_wi = hash_maps
    out = dict(annotations)
    for ss in todo:
        warnings.extend(metadata.apply_patch_pod_metadata(out, ss.patch_pod_metadata, sidecarset=ss.name))
    out[names.ANN_HASH] = metadata.with_entries(hash_map, todo, now=now, without_image=False)
    out[names.ANN_HASH_WITHOUT_IMAGE] = metadata.with_entries(hash_map_wi, todo, now=now, without_image=True)
    out[names.ANN_INJECTED_LIST] = metadata.with_injected_list(
        annotations.get(names.ANN_INJECTED_LIST), [ss.name for ss in todo], drop=replaced
    )
    if built.hot:
        out.update(hotupgrade.pod_annotations(annotations.get(names.ANN_WORKING_HOT), built.hot, warnings))
    sidecar_names = {str(c["name"]) for _, c in built.containers}
    first_app = next((str(c["name"]) for c in apps.containers if c["name"] not in sidecar_names), None)
    if names.ANN_DEFAULT_CONTAINER not in out and first_app is not None:
        out[names.ANN_DEFAULT_CONTAINER] = first_app
    out[names.ANN_INJECTED_BY] = names.INJECTED_BY_WEBHOOK
    return out


def _metadata_ops(pod: Mapping[str, Any], labels: dict[str, str], annotations: dict[str, str]) -> list[JsonObj]:
    meta = pod.get("metadata")
    if not is_object(meta):
        return [{"op": "add", "path": "/metadata", "value": {"labels": labels, "annotations": annotations}}]
    return patchops.map_ops("/metadata/labels", meta.get("labels"), labels) + patchops.map_ops(
        "/metadata/annotations", meta.get("annotations"), annotations
    )


def _left_by_replaced_bases(
    spec: Mapping[str, Any],
    annotations: Mapping[str, str],
    sidecarsets: Sequence[SidecarSet],
    replaced: frozenset[str],
    built: build.Built,
) -> frozenset[str]:
    """Sidecars a replaced base put into the pod that its canary does not put back: removed.

    A pod reaches the webhook already injected with a base its canary replaces when the base's
    MutatingAdmissionPolicy ran first (the moment before the API server enforces the version that
    leaves the canary's pods alone). Only containers the base injected go: the base is in the pod's
    injected list, the name is one of the base's sidecars, and the container carries IS_INJECTED.
    """
    if not replaced:
        return frozenset()
    injected = metadata.injected_list(annotations.get(names.ANN_INJECTED_LIST))
    bases = [ss for ss in sidecarsets if ss.name in replaced and ss.name in injected]
    theirs = {n for ss in bases for n in ss.all_names_in_pod}
    kept = {str(c["name"]) for _, c in (*built.containers, *built.init_containers)}
    return frozenset(
        str(c["name"])
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
        if is_object(c) and c.get("name") in theirs and c.get("name") not in kept and envs.is_injected(c)
    )


def _spec_ops(
    spec: Mapping[str, Any], built: build.Built, *, drop: frozenset[str] = frozenset()
) -> list[JsonObj] | str:
    """The ops that remove the containers named in `drop`, then place containers, volumes and pull
    secrets; or the name a bug would duplicate."""
    ops: list[JsonObj] = []
    lists: dict[str, list[Any]] = {}
    for key in ("initContainers", "containers"):
        original = spec.get(key) or []
        if drop:
            gone = [i for i, c in enumerate(original) if is_object(c) and c.get("name") in drop]
            # Removed from the end first, so each index is still the original one; placed after
            # that on the list without them.
            ops += [{"op": "remove", "path": f"/spec/{key}/{i}"} for i in reversed(gone)]
            original = [c for i, c in enumerate(original) if i not in gone]
        lists[key] = original
    placements = {
        key: (lists[key], *placement.placement(lists[key], items))
        for key, items in (("initContainers", built.init_containers), ("containers", built.containers))
    }
    duplicate = placement.duplicate_name(placements.values())
    if duplicate is not None:
        return duplicate
    for key, (original, replace, before, after) in placements.items():
        ops += patchops.list_ops(f"/spec/{key}", original, replace=replace, before=before, after=after)
    ops += patchops.append_ops(
        "/spec/volumes", spec.get("volumes"), volumes.new_by_name(spec.get("volumes") or [], built.volumes)
    )
    ops += patchops.append_ops(
        "/spec/imagePullSecrets",
        spec.get("imagePullSecrets"),
        volumes.new_by_name(spec.get("imagePullSecrets") or [], built.pull_secrets),
    )
    return ops
