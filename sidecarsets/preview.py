"""What the controller would do with a SidecarSet spec, worked out without touching the cluster.

`sidecarctl preview` answers "what happens if I apply this?" and `sidecarctl status` "where does the
rollout stand?". Both must give the controller's own answers, not a second opinion that drifts from
it, so nothing here decides anything the planner decides: the rollout is simulated by calling
`planner.plan_upgrade` pass after pass, as the controller does, on pod copies to which each pass's
patch is applied and on which a kubelet is simulated (the new image running and ready), until the
planner has nothing more to do. Whatever the planner honours (partition, maxUnavailable, the
update selector, priority, scatter, pods already not ready) the simulation honours by construction.

The simulation assumes the best case the controller can see: every patched pod comes back ready at
once, before the next pass. A real rollout whose pods come back one by one plans more often with
smaller batches, so the batches shown are the waves of a rollout whose pods restart promptly.

The rest explains the planner's verdicts: which container fields stop a pod from being upgraded in
place, how the file's containers differ from the stored ones, and which pods the spec no longer
owns. Pure functions of JSON objects; the CLI does the reading.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets import deadline, hashing, names, planner, podstate, revisions, selectors, status
from sidecarsets.defaults import apply_defaults
from sidecarsets.model import SidecarSet
from sidecarsets.projection import PodProjection, project

# Container fields the API server fills in on a pod when the spec leaves them out: a pod carrying
# them while the SidecarSet does not is no difference.
API_DEFAULTED_FIELDS = frozenset({"terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "resources"})
NOT_VISIBLE = (
    "a SidecarSet-only field (podInjectPolicy, upgradeStrategy, shareVolumePolicy, transferEnv, "
    "resourcesPolicy), not visible in the pod"
)
_BOOKKEEPING_ANNOTATIONS = (
    names.ANN_HASH,
    names.ANN_HASH_WITHOUT_IMAGE,
    names.ANN_INJECTED_LIST,
    names.ANN_INPLACE_STATE,
    names.ANN_INJECTED_BY,
    names.ANN_WORKING_HOT,
)


class PreviewError(ValueError):
    """The simulation cannot go on (a patch that does not apply to the pod it was planned for)."""


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _map(pod.get("metadata"))
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _key(p: PodProjection) -> str:
    return f"{p.namespace}/{p.name}"


# ---------------------------------------------------------------------------------------------
# The simulated node


def simulated_image_id(image: str) -> str:
    """An imageID for `image` that no real runtime reported before the upgrade (so the planner sees
    the upgrade land); a digest-pinned image reports its own digest, as a runtime does."""
    if "@" in image:
        return image
    return f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def kubelet_report(pod: JsonObj, *, now: str) -> JsonObj:
    """A copy of `pod` as the kubelet reports it once every container whose spec image changed runs
    the new image and is ready; nothing else changes.

    A pod that is not Running (or is being deleted) is left as it is: no node is starting it in a
    preview. The pod is ready afterwards when all its containers are, unless it was not ready for
    a reason of its own (every container ready, the pod still not: a readiness gate).
    """
    out = copy.deepcopy(pod)
    meta, spec = out.get("metadata") or {}, out.get("spec") or {}
    st = out.get("status")
    if not isinstance(st, dict) or st.get("phase") != "Running" or meta.get("deletionTimestamp") is not None:
        return out
    images = {c.get("name"): c.get("image") for c in spec.get("containers") or [] if isinstance(c, dict)}
    natives = {
        c.get("name"): c.get("image")
        for c in spec.get("initContainers") or []
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    }
    statuses = [cs for cs in st.get("containerStatuses") or [] if isinstance(cs, dict)]
    init_statuses = [cs for cs in st.get("initContainerStatuses") or [] if isinstance(cs, dict)]

    def all_ready() -> bool:
        return (
            len(statuses) == len(images)
            and all(cs.get("ready") is True for cs in statuses)
            and all(cs.get("ready") is True for cs in init_statuses if cs.get("name") in natives)
        )

    conditions = [c for c in st.get("conditions") or [] if isinstance(c, dict)]
    was_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    held_back = not was_ready and all_ready()
    changed = False
    for wanted, group in ((images, statuses), (natives, init_statuses)):
        for cs in group:
            image = wanted.get(cs.get("name"))
            if not isinstance(image, str) or cs.get("image") == image:
                continue
            restarts = cs.get("restartCount")
            cs.update(
                image=image,
                imageID=simulated_image_id(image),
                ready=True,
                started=True,
                restartCount=(restarts if isinstance(restarts, int) else 0) + 1,
                state={"running": {"startedAt": now}},
            )
            changed = True
    if not changed:
        return out
    ready = all_ready() and not held_back
    text = "True" if ready else "False"
    for kind in ("ContainersReady", "Ready"):
        cond = next((c for c in conditions if c.get("type") == kind), None)
        if cond is None:
            conditions.append({"type": kind, "status": text, "lastTransitionTime": now})
        elif cond.get("status") != text:
            cond.update(status=text, lastTransitionTime=now)
    st["conditions"] = conditions
    return out


def apply_upgrade(pod: JsonObj, patch: Sequence[JsonObj]) -> JsonObj:
    """The pod after a planner patch, as the API server stores it (a new resourceVersion)."""
    try:
        result: JsonObj = jsonpatch.apply_patch(pod, list(patch))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise PreviewError(f"pod {pod_key(pod)}: the planned patch does not apply: {e}") from None
    meta = result.setdefault("metadata", {})
    rv = str(meta.get("resourceVersion") or "0")
    meta["resourceVersion"] = str(int(rv) + 1) if rv.isdigit() else rv + "+1"
    return result


# ---------------------------------------------------------------------------------------------
# The rollout


@dataclass(frozen=True)
class Batch:
    number: int
    pods: tuple[str, ...]  # namespace/name, in the order the planner chose them


@dataclass(frozen=True)
class Rollout:
    """The simulated rollout: the batches, and where the planner stops after the last one."""

    batches: tuple[Batch, ...]
    stage: str  # the planner's Stage value after the last batch
    reason: str
    max_unavailable: int
    partition: int  # pods the partition keeps on the old revision
    matched: tuple[str, ...]
    already_updated: tuple[str, ...]  # carrying the spec's hash before the first batch
    unavailable_before: int  # pods the planner counted unavailable before the first batch
    not_upgradable: tuple[str, ...]
    kept: tuple[str, ...]  # held back by the partition at the end
    # (pod, why): updated (or in flight) and still not ready at the end: they hold the budget
    waiting_on: tuple[tuple[str, str], ...]
    excluded_by_selector: tuple[str, ...]
    not_ready_before: tuple[tuple[str, str], ...] = ()  # (pod, why): matched pods not available at the start
    flips: int = 0  # HotUpgrade flip passes between batches
    upgraded: tuple[str, ...] = field(default=())

    @property
    def done(self) -> bool:
        return self.stage == planner.Stage.DONE.value


def partition_of(ss: SidecarSet, total: int) -> int:
    """Pods the partition keeps, counted over `total` matched pods as the planner counts them."""
    return planner._partition(ss.update_strategy.partition, total)


def _excluded(ss: SidecarSet, matched: Sequence[PodProjection], verdicts: podstate.Verdicts) -> tuple[str, ...]:
    sel = ss.update_strategy.selector
    if sel is None:
        return ()
    match = selectors.matcher(sel)
    return tuple(
        sorted(
            _key(p) for p, updated in zip(matched, verdicts.updated, strict=True) if not updated and not match(p.labels)
        )
    )


def simulate_rollout(
    ss: SidecarSet,
    pods: Iterable[JsonObj],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    revision: str,
    now: str,
    max_passes: int | None = None,
) -> Rollout:
    """The rollout of `ss` over `pods` (raw pod objects; only those it matches take part), pass by
    pass as the controller runs it, each pass's pods coming back upgraded and ready before the next."""
    raw: dict[str, JsonObj] = {}
    for obj in pods:
        raw.setdefault(pod_key(obj), obj)
    projected = {k: project(v) for k, v in raw.items()}
    passes_left = max_passes if max_passes is not None else 2 * len(raw) + 10

    def look() -> tuple[list[PodProjection], podstate.Verdicts]:
        matched = status.matched_pods(ss, projected.values(), namespace_labels)
        return matched, status.evaluate(ss, matched)

    def replace(key: str, value: JsonObj) -> None:
        raw[key] = value
        projected[key] = project(value)

    matched, verdicts = look()
    first = planner.plan_upgrade(ss, matched, revision=revision, now=now, verdicts=verdicts)
    stopped = deadline.is_stopped(ss)  # then the controller touches no pod until the spec or the condition changes
    if stopped:
        first = dataclasses.replace(first, upgrades=())
        passes_left = 0
    already = tuple(sorted(_key(p) for p, u in zip(matched, verdicts.updated, strict=True) if u))
    not_ready = tuple(
        sorted((_key(p), not_ready_reason(ss, p)) for p, ok in zip(matched, verdicts.available, strict=True) if not ok)
    )
    excluded = _excluded(ss, matched, verdicts)
    batches: list[Batch] = []
    upgraded: list[str] = []
    flips = 0
    plan = first
    while passes_left > 0:
        passes_left -= 1
        if not plan.upgrades:
            if plan.stage is not planner.Stage.WAITING:
                break
            # Waiting on pods already upgrading: the kubelet lands their images, then the planner goes on.
            landed = False
            for p in matched:
                key = _key(p)
                after = kubelet_report(raw[key], now=now)
                if after != raw[key]:
                    replace(key, after)
                    landed = True
            if not landed:
                break
        else:
            for u in plan.upgrades:
                key = f"{u.namespace}/{u.name}"
                replace(key, kubelet_report(apply_upgrade(raw[key], u.patch), now=now))
            if plan.stage is planner.Stage.FLIPPING:
                flips += 1
            else:
                chosen = tuple(f"{u.namespace}/{u.name}" for u in plan.upgrades)
                batches.append(Batch(len(batches) + 1, chosen))
                upgraded += chosen
        matched, verdicts = look()
        plan = planner.plan_upgrade(ss, matched, revision=revision, now=now, verdicts=verdicts)
    stuck = {f"{ns}/{n}" for ns, n in plan.not_upgradable}
    selected = selectors.matcher(ss.update_strategy.selector) if ss.update_strategy.selector is not None else None
    kept: list[str] = []
    waiting: list[tuple[str, str]] = []
    for p, is_new, moving, ok in zip(matched, verdicts.updated, verdicts.in_flight, verdicts.available, strict=True):
        key = _key(p)
        if (is_new or moving) and not ok:
            waiting.append((key, not_ready_reason(ss, p)))
        elif (
            plan.stage is planner.Stage.PARTITION
            and not is_new
            and key not in stuck
            and (selected is None or selected(p.labels))
        ):
            kept.append(key)
    return Rollout(
        batches=tuple(batches),
        stage="stopped" if stopped else plan.stage.value,
        reason=_stopped_reason(ss) if stopped else plan.reason,
        max_unavailable=plan.max_unavailable,
        partition=partition_of(ss, len(matched)),
        matched=tuple(sorted(_key(p) for p in matched)),
        already_updated=already,
        unavailable_before=first.unavailable,
        not_upgradable=tuple(sorted(f"{ns}/{n}" for ns, n in first.not_upgradable)),
        kept=tuple(sorted(kept)),
        waiting_on=tuple(sorted(waiting)),
        excluded_by_selector=excluded,
        not_ready_before=not_ready,
        flips=flips,
        upgraded=tuple(upgraded),
    )


def _stopped_reason(ss: SidecarSet) -> str:
    conditions = ss.status.get("conditions") if isinstance(ss.status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == names.CONDITION_PROGRESSING:
            return f"stopped ({names.REASON_DEADLINE_EXCEEDED}): {c.get('message') or ''}".rstrip(": ")
    return f"stopped ({names.REASON_DEADLINE_EXCEEDED})"


def would_be_revision(ss: SidecarSet, stored_revisions: Iterable[Mapping[str, Any]]) -> str:
    """The ControllerRevision name the controller would record for this spec: an existing revision
    with the same data (which it reuses), else the name it would create."""
    data = revisions.revision_data(ss)
    for r in stored_revisions:
        meta = r.get("metadata")
        labels = (meta.get("labels") if isinstance(meta, Mapping) else None) or {}
        if labels.get(names.REVISION_LABEL_SIDECARSET) == ss.name and r.get("data") == data:
            return str(meta.get("name") if isinstance(meta, Mapping) else "")
    return revisions.revision_name(ss.name, revisions.revision_hash(data, ss.collision_count))


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
    containers when one of them is a native sidecar (sidecarsets.hashing)."""
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
    spec, meta = _map(pod.get("spec")), _map(pod.get("metadata"))
    in_pod = {**_by_name(spec.get("initContainers")), **_by_name(spec.get("containers"))}
    working = _working(meta)
    out: list[str] = []
    sidecars = [*ss.containers, *(c for c in ss.init_containers if c.native)]
    for sc in sidecars:
        actual = in_pod.get(working.get(sc.name, f"{sc.name}-1") if sc.hot else sc.name)
        if actual is None:
            out.append(f"{sc.name}: not in the pod")
            continue
        wanted = sc.container
        transferred = frozenset(n for t in sc.transfer_env for n in t.env_names)
        differing: set[str] = set()
        for key in set(wanted) | set(actual):
            if key in ("image", "name"):
                continue
            if key == "env":
                own = _env_of(wanted.get("env"), frozenset())
                got = _env_of(actual.get("env"), frozenset({names.ENV_IS_INJECTED}) | (transferred - set(own)))
                if own != got:
                    differing.add(key)
            elif key in ("volumeMounts", "volumeDevices") and (sc.share_volumes or sc.share_volume_devices):
                got_mounts = _by_name(actual.get(key))
                if not all(_covers(m, got_mounts.get(n)) for n, m in _by_name(wanted.get(key)).items()):
                    differing.add(key)
            elif key == "resources" and sc.resources_policy is not None:
                continue
            elif key not in wanted:
                if key not in API_DEFAULTED_FIELDS and not _empty(actual.get(key)):
                    differing.add(key)
            elif not _covers(wanted[key], actual.get(key)):
                differing.add(key)
        out += [f"{sc.name}: {f}" for f in sorted(differing)]
    entry = _hash_entry(meta, ss.name)
    listed = entry.get("sidecarList") if isinstance(entry, Mapping) else None
    current = {c.name for c in sidecars}
    out += [f"{n}: removed" for n in listed or [] if isinstance(n, str) and n not in current]
    return out


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _annotation_json(meta: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    raw = _map(meta.get("annotations")).get(key)
    try:
        parsed = orjson.loads(raw) if isinstance(raw, str) else {}
    except orjson.JSONDecodeError:
        return {}
    return _map(parsed)


def _working(meta: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in _annotation_json(meta, names.ANN_WORKING_HOT).items()}


def _hash_entry(meta: Mapping[str, Any], ss_name: str, key: str = names.ANN_HASH) -> Any:
    return _annotation_json(meta, key).get(ss_name)


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
    meta = _map(pod.get("metadata"))
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
        out.append((f"stored SidecarSet {stored.name} (generation {stored.generation})", stored.spec))
        mine = [
            r
            for r in stored_revisions
            if ((r.get("metadata") or {}).get("labels") or {}).get(names.REVISION_LABEL_SIDECARSET) == stored.name
        ]
        try:
            ordered = revisions.sort_revisions(mine)
        except revisions.RevisionError:
            ordered = [dict(r) for r in mine]
        for r in reversed(ordered):
            data = r.get("data")
            spec = data.get("spec") if isinstance(data, Mapping) else None
            if isinstance(spec, Mapping):
                out.append((f"ControllerRevision {(r.get('metadata') or {}).get('name')}", spec))
    return out


# ---------------------------------------------------------------------------------------------
# Pods the spec does not (or no longer) own


@dataclass(frozen=True)
class Unowned:
    pod: str
    reason: str

    def as_json(self) -> JsonObj:
        return {"pod": self.pod, "reason": self.reason}


def unowned_pods(
    ss: SidecarSet, pods: Iterable[PodProjection], namespace_labels: Mapping[str, Mapping[str, str]]
) -> tuple[list[Unowned], list[Unowned]]:
    """(pods injected by it that this spec does not match, pods it selects that it never injected).

    Neither kind is upgraded: the controller owns only active pods whose injected list names the
    SidecarSet and that carry all of its sidecars (sidecarsets.status.matched_pods).
    """
    matched = {_key(p) for p in status.matched_pods(ss, list(pods), namespace_labels)}
    cold, hot, native, hot_init = ss.cold_names, ss.hot_names, ss.native_init_names, ss.hot_init_names
    dropped: list[Unowned] = []
    never: list[Unowned] = []
    for p in pods:
        key = _key(p)
        if key in matched or not podstate.is_active(p):
            continue
        in_ns = ss.matches_namespace(p.namespace, namespace_labels.get(p.namespace))
        selected = in_ns and not selectors.is_empty(ss.selector) and ss.matches_pod(p.labels)
        if ss.name not in p.injected:
            if selected:
                never.append(Unowned(key, "never injected by it (created before it, or not admitted through it)"))
            continue
        if not in_ns:
            dropped.append(Unowned(key, "its namespace is no longer in the SidecarSet's scope"))
        elif not selected:
            dropped.append(Unowned(key, "the selector no longer matches its labels"))
        elif not podstate.has_sidecars(p, cold=cold, hot=hot, native_init=native, hot_init=hot_init):
            have = {n for n, _ in (*p.containers, *p.init_containers)}
            missing = [n for n in (*cold, *native) if n not in have] + [
                n for n in (*hot, *hot_init) if f"{n}-1" not in have
            ]
            dropped.append(
                Unowned(key, f"lacks sidecar(s) {', '.join(missing) or '?'} of this spec: only a new pod gets them")
            )
    dropped.sort(key=lambda u: u.pod)
    never.sort(key=lambda u: u.pod)
    return dropped, never


def not_ready_reason(ss: SidecarSet, pod: PodProjection) -> str:
    """What the kubelet says about a matched pod that is not available."""
    containers = sorted({*ss.cold_images, *ss.native_images})
    if pod.phase != "Running":
        return f"phase {pod.phase or 'unknown'}"
    if not podstate.is_consistent(pod, sidecarset=ss.name, containers=set(containers)):
        return "the new image is not reported running yet"
    return deadline.why_not_ready(pod, containers)


__all__ = [
    "Batch",
    "Blocked",
    "ContainerChange",
    "PreviewError",
    "Rollout",
    "Unowned",
    "apply_upgrade",
    "container_changes",
    "field_differences",
    "known_specs",
    "kubelet_report",
    "not_ready_reason",
    "partition_of",
    "pod_differences",
    "pod_key",
    "simulate_rollout",
    "simulated_image_id",
    "spec_differences",
    "spec_field_changes",
    "unowned_pods",
    "why_not_upgradable",
    "would_be_revision",
]
