"""How a SidecarSet spec differs from the stored one, its revisions and the pods, and so why a pod
cannot be upgraded in place.

The planner's verdict on a pod is one hash against another (the without-image hash); people need
the fields behind it. Here are the per-container differences of two specs (defaults applied, as
the API server stores them), of a spec against the containers a pod carries, and the search for
the spec a pod was injected from. Pure functions of JSON objects; the CLI does the reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj, mapping, parse_object, resolve
from sidecarsets.pods.podkeys import pod_key
from sidecarsets.spec import hashing, names, revisions
from sidecarsets.spec.defaults import apply_defaults
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import SidecarContainer, hot_pair

# Container fields the API server fills in on a pod when the spec leaves them out: a pod carrying
# them while the SidecarSet does not is no difference.
API_DEFAULTED_FIELDS = frozenset({"terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "resources"})
NOT_VISIBLE = (
    "a SidecarSet-only field (podInjectPolicy, upgradeStrategy, shareVolumePolicy, transferEnv, "
    "resourcesPolicy), not visible in the pod"
)


# ---------------------------------------------------------------------------------------------
# Container differences


@dataclass(frozen=True)
class ContainerChange:
    """One sidecar container of the stored spec against the file's."""

    name: str
    kind: str  # "container" or "initContainer"
    change: str  # added, removed, changed, unchanged
    old_image: str | None
    new_image: str | None
    fields: tuple[str, ...]  # fields other than the image that differ

    def as_json(self) -> JsonObj:
        return {
            "name": self.name,
            "kind": self.kind,
            "change": self.change,
            "image": {"old": self.old_image, "new": self.new_image},
            "fields": list(self.fields),
        }


def _defaulted(spec: Mapping[str, Any]) -> dict[str, Any]:
    only = {k: spec[k] for k in ("containers", "initContainers") if isinstance(spec.get(k), list)}
    out: dict[str, Any] = apply_defaults({"spec": only})["spec"]
    return out


def _by_name(items: Any) -> dict[str, Mapping[str, Any]]:
    return {
        str(c["name"]): c
        for c in (items if isinstance(items, list) else [])
        if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    }


def _image(c: Mapping[str, Any] | None) -> str | None:
    value = None if c is None else c.get("image")
    return value if isinstance(value, str) else None


def field_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """Top-level container fields (the image aside) whose values differ, in name order."""
    return tuple(sorted(k for k in set(old) | set(new) if k != "image" and old.get(k) != new.get(k)))


def container_changes(old_spec: Mapping[str, Any] | None, new_spec: Mapping[str, Any]) -> list[ContainerChange]:
    """Each sidecar container and init container of either spec (defaults applied to both, as the
    API server stores them), the new spec's order first; `old_spec` None: all are added."""
    old = _defaulted(old_spec or {})
    new = _defaulted(new_spec)
    out: list[ContainerChange] = []
    for key, kind in (("initContainers", "initContainer"), ("containers", "container")):
        before, after = _by_name(old.get(key)), _by_name(new.get(key))
        fields: tuple[str, ...]
        for name in [*after, *(n for n in before if n not in after)]:
            a, b = before.get(name), after.get(name)
            if a is None:
                change, fields = "added", ()
            elif b is None:
                change, fields = "removed", ()
            else:
                fields = field_differences(a, b)
                change = "changed" if fields or _image(a) != _image(b) else "unchanged"
            out.append(ContainerChange(name, kind, change, _image(a), _image(b), fields))
    return out


def spec_field_changes(old_spec: Mapping[str, Any] | None, new_spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Spec fields other than the sidecar containers that differ (defaults applied to both)."""
    if old_spec is None:
        return ()
    a = apply_defaults({"spec": dict(old_spec)})["spec"]
    b = apply_defaults({"spec": dict(new_spec)})["spec"]
    return tuple(
        sorted(k for k in set(a) | set(b) if k not in ("containers", "initContainers") and a.get(k) != b.get(k))
    )


def _hashed(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, container) of what the without-image hash covers: the containers, and the init
    containers when one of them is a native sidecar (sidecarsets.spec.hashing)."""
    d = _defaulted(spec)
    out = [(str(c.get("name")), c) for c in d.get("containers") or [] if isinstance(c, Mapping)]
    inits = [c for c in d.get("initContainers") or [] if isinstance(c, Mapping)]
    if any(c.get("restartPolicy") == "Always" for c in inits):
        out += [(str(c.get("name")), c) for c in inits]
    return out


def spec_differences(old_spec: Mapping[str, Any], new_spec: Mapping[str, Any]) -> list[str]:
    """`name: field` for every difference beyond the images between what two specs put in a pod's
    hash (`name: added` / `name: removed` for whole containers)."""
    old, new = dict(_hashed(old_spec)), dict(_hashed(new_spec))
    out: list[str] = []
    for name, c in new.items():
        if name not in old:
            out.append(f"{name}: added")
        else:
            out += [f"{name}: {f}" for f in field_differences(old[name], c)]
    out += [f"{name}: removed" for name in old if name not in new]
    return out


# -- against the pod itself ----------------------------------------------------------------------
def _env_of(items: Any, drop: frozenset[str]) -> dict[str, Any]:
    return {
        str(e.get("name")): {k: v for k, v in e.items() if k != "name"}
        for e in (items if isinstance(items, list) else [])
        if isinstance(e, Mapping) and e.get("name") not in drop
    }


def _covers(wanted: Any, actual: Any) -> bool:
    """`actual` holds everything `wanted` says (maps may carry more keys: API server defaults)."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(_covers(v, actual.get(k)) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(_covers(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    return bool(wanted == actual)


def _empty(value: Any) -> bool:
    return value in (None, {}, [], "")


def pod_differences(ss: SidecarSet, pod: Mapping[str, Any]) -> list[str]:
    """`name: field` for each sidecar field of the spec that the pod's container does not carry.

    Only what reaches the pod can be compared: what injection adds (IS_INJECTED, transferred env
    vars, volumes shared from the app containers, resources from a resourcesPolicy) and what the
    API server defaults are not differences; the SidecarSet-only fields cannot be seen at all.
    """
    spec, meta = mapping(pod, "spec"), mapping(pod, "metadata")
    in_pod = {**_by_name(spec.get("initContainers")), **_by_name(spec.get("containers"))}
    working = _working(meta)
    out: list[str] = []
    sidecars = [*ss.containers, *(c for c in ss.init_containers if c.native)]
    for sc in sidecars:
        # A HotUpgrade sidecar is compared with the container of its pair that serves.
        actual = in_pod.get(working.get(sc.name, hot_pair(sc.name)[0]) if sc.hot else sc.name)
        if actual is None:
            out.append(f"{sc.name}: not in the pod")
        else:
            out += [f"{sc.name}: {key}" for key in sorted(_differing_fields(sc, actual))]
    current = {c.name for c in sidecars}
    out += [f"{n}: removed" for n in _injected_sidecars(meta, ss.name) if n not in current]
    return out


def _differing_fields(sc: SidecarContainer, actual: Mapping[str, Any]) -> set[str]:
    """The fields of sidecar `sc` that its container in the pod, `actual`, does not carry."""
    keys = (set(sc.container) | set(actual)) - {"image", "name"}
    return {key for key in keys if _field_differs(sc, key, actual)}


def _field_differs(sc: SidecarContainer, key: str, actual: Mapping[str, Any]) -> bool:
    wanted = sc.container
    if key == "env":
        return _env_differs(sc, actual)
    if key in ("volumeMounts", "volumeDevices") and (sc.share_volumes or sc.share_volume_devices):
        # Shared volumes add the app containers' mounts: only the sidecar's own must be there.
        got = _by_name(actual.get(key))
        return not all(_covers(m, got.get(n)) for n, m in _by_name(wanted.get(key)).items())
    if key == "resources" and sc.resources_policy is not None:
        return False  # computed per pod by the resourcesPolicy
    if key not in wanted:
        return key not in API_DEFAULTED_FIELDS and not _empty(actual.get(key))
    return not _covers(wanted[key], actual.get(key))


def _env_differs(sc: SidecarContainer, actual: Mapping[str, Any]) -> bool:
    """Injection adds IS_INJECTED and the transferred vars the sidecar does not set itself: those
    are not differences."""
    own = _env_of(sc.container.get("env"), frozenset())
    transferred = frozenset(n for t in sc.transfer_env for n in t.env_names)
    got = _env_of(actual.get("env"), frozenset({names.ENV_IS_INJECTED}) | (transferred - set(own)))
    return own != got


def _injected_sidecars(meta: Mapping[str, Any], ss_name: str) -> list[str]:
    """The sidecars the pod's hash annotation says this SidecarSet injected."""
    listed = resolve(_hash_entry(meta, ss_name), "sidecarList")
    return [n for n in listed or [] if isinstance(n, str)]


def _working(meta: Mapping[str, Any]) -> dict[str, str]:
    working = parse_object(resolve(meta, "annotations", names.ANN_WORKING_HOT))
    return {str(k): str(v) for k, v in working.items()}


def _hash_entry(meta: Mapping[str, Any], ss_name: str, key: str = names.ANN_HASH) -> Any:
    return parse_object(resolve(meta, "annotations", key)).get(ss_name)


@dataclass(frozen=True)
class Blocked:
    """A pod that cannot be upgraded in place, and why."""

    pod: str
    fields: tuple[str, ...]
    compared_with: str  # what the new spec was compared with: a revision, the stored spec, or the pod

    def as_json(self) -> JsonObj:
        return {"pod": self.pod, "fields": list(self.fields), "comparedWith": self.compared_with}


def why_not_upgradable(
    ss: SidecarSet, pod: Mapping[str, Any], known_specs: Sequence[tuple[str, Mapping[str, Any]]]
) -> Blocked:
    """Which fields beyond the image keep `pod` from being upgraded to `ss` in place.

    The planner's test is the pod's without-image hash against the spec's. The spec the pod was
    injected from is found among `known_specs` ((label, spec): the stored SidecarSet, its
    ControllerRevisions) by that hash and compared field by field; when none has it, the pod's own
    containers are compared with the new spec.
    """
    meta = mapping(pod, "metadata")
    entry = _hash_entry(meta, ss.name, names.ANN_HASH_WITHOUT_IMAGE)
    recorded = entry.get("hash") if isinstance(entry, Mapping) else entry if isinstance(entry, str) else None
    key = pod_key(pod)
    if not recorded:
        return Blocked(key, ("no without-image hash recorded for this SidecarSet (not injected by it)",), "pod")
    for label, spec in known_specs:
        if hashing.spec_hash_without_image(spec) == recorded:
            found = spec_differences(spec, ss.spec)
            return Blocked(key, tuple(found) or (NOT_VISIBLE,), label)
    found = pod_differences(ss, pod)
    return Blocked(key, tuple(found) or (NOT_VISIBLE,), "pod")


def known_specs(
    stored: SidecarSet | None, stored_revisions: Iterable[Mapping[str, Any]]
) -> list[tuple[str, Mapping[str, Any]]]:
    """The specs pods may have been injected from: the stored SidecarSet's, then its revisions' (newest first)."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    if stored is not None:
        out.append((f"stored {stored.kind} {stored.name} (generation {stored.generation})", stored.spec))
        owner = revisions.owner_name(stored)
        # `stored_revisions` are of the namespace its revisions live in (a NamespacedSidecarSet's own).
        mine = [
            r
            for r in stored_revisions
            if ((r.get("metadata") or {}).get("labels") or {}).get(names.REVISION_LABEL_SIDECARSET) == owner
        ]
        try:
            ordered = revisions.sort_revisions(mine)
        except revisions.RevisionError:
            ordered = [dict(r) for r in mine]
        for r in reversed(ordered):
            spec = resolve(r, "data", "spec")
            if isinstance(spec, Mapping):
                out.append((f"ControllerRevision {resolve(r, 'metadata', 'name')}", spec))
    return out
