"""The few pod fields the SidecarSet controller needs, kept instead of whole pods.

A cluster with thousands of injected pods would hold hundreds of megabytes of pod JSON if the
watch cache kept every object; the controller only needs identity, labels, readiness, the
sidecar bookkeeping annotations and the container images. `project` copies exactly those out
of a raw pod, interning the strings that repeat across pods (label keys and values, images,
image IDs, hashes, node and namespace names) so one copy serves them all.

A pod is user data: a missing or malformed field gives an empty value, never an exception.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from kuberuntime.jsontypes import mapping, parse_object, resolve
from sidecarsets.pods.podrecords import ContainerState, HashEntry, InplaceEntry, Labels, Resources
from sidecarsets.spec.names import (
    ANN_HASH,
    ANN_HASH_WITHOUT_IMAGE,
    ANN_INJECTED_LIST,
    ANN_INPLACE_STATE,
    ANN_OVERRIDES,
    ANN_OVERRIDES_ENV_APPLIED,
    ANN_VERSION_ALT_PREFIX,
    ANN_VERSION_PREFIX,
    ANN_WORKING_HOT,
    POD_CONDITION_UPGRADABLE,
)


@dataclass(frozen=True, slots=True)
class PodProjection:
    """An injected pod as the controller sees it; read-only, detached from the source JSON."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    labels: Labels
    creation_timestamp: str
    deleting: bool
    phase: str
    ready: bool
    ready_since: str
    node_name: str
    hashes: tuple[HashEntry, ...]
    hashes_without_image: tuple[HashEntry, ...]  # update times dropped: never rewritten
    injected: tuple[str, ...]
    inplace_state: tuple[InplaceEntry, ...]
    containers: tuple[tuple[str, str], ...]  # (name, image) in spec order
    init_containers: tuple[tuple[str, str], ...]
    container_statuses: tuple[ContainerState, ...]
    init_statuses: tuple[ContainerState, ...]  # native sidecars are upgraded in place too
    total_restarts: int
    upgradable_condition: tuple[str, ...]  # (status, reason, message) or ()
    hot_working: tuple[tuple[str, str], ...] = ()  # HotUpgrade: (sidecar, the -1/-2 container serving)
    hot_versions: tuple[tuple[str, str, str], ...] = ()  # HotUpgrade: (container, version, version-alt)
    # In-place resize: every container's resources as the spec asks (containers, then init
    # containers), as the kubelet reports them applied, and the pod's resize conditions
    # (type, reason, message) of PodResizePending / PodResizeInProgress.
    resources: tuple[Resources, ...] = ()
    applied_resources: tuple[Resources, ...] = ()
    resize_conditions: tuple[tuple[str, str, str], ...] = ()
    # Per-pod overrides (sidecarsets.overrides): the annotation as the pod carries it, and the env
    # values injection applied; None where absent. Replicas share one interned text.
    overrides: str | None = None
    overrides_env: str | None = None

    def hash_for(self, sidecarset: str) -> HashEntry | None:
        return _entry(self.hashes, sidecarset)

    def hash_without_image_for(self, sidecarset: str) -> HashEntry | None:
        return _entry(self.hashes_without_image, sidecarset)

    def inplace_for(self, sidecarset: str) -> InplaceEntry | None:
        for entry in self.inplace_state:
            if entry.sidecarset == sidecarset:
                return entry
        return None

    def working(self, sidecar: str) -> str | None:
        """The container of a HotUpgrade pair that serves, as the pod's annotation says."""
        for name, container in self.hot_working:
            if name == sidecar:
                return container
        return None

    def version(self, container: str) -> tuple[str, str]:
        """(version, version-alt) annotations of a HotUpgrade container ("" when absent)."""
        for name, version, alt in self.hot_versions:
            if name == container:
                return version, alt
        return "", ""

    def image_of(self, container: str) -> str | None:
        """The spec image of a container or init container."""
        for name, image in (*self.containers, *self.init_containers):
            if name == container:
                return image
        return None

    def status_of(self, container: str) -> ContainerState | None:
        """The status of a container or init container (a pod's names are unique across both)."""
        for cs in self.container_statuses:
            if cs.name == container:
                return cs
        for cs in self.init_statuses:
            if cs.name == container:
                return cs
        return None

    def resources_of(self, container: str, *, applied: bool = False) -> Resources | None:
        """The spec resources of a container or init container; with `applied`, what the kubelet
        reports applied to it (None: it reports none)."""
        return next((r for r in (self.applied_resources if applied else self.resources) if r.name == container), None)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _entry(entries: tuple[HashEntry, ...], sidecarset: str) -> HashEntry | None:
    for entry in entries:
        if entry.sidecarset == sidecarset:
            return entry
    return None


_intern = sys.intern


def _istr(value: Any) -> str:
    """An interned string, or "" for anything that is not a string."""
    return _intern(value) if isinstance(value, str) else ""


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


_T = TypeVar("_T", bound=Hashable)


class _Shared:
    """Hands out one instance per distinct immutable value.

    Pods of one workload repeat the same label sets, container lists, container states and
    annotation entries, so most projections can point at a shared copy. Only values that
    usually repeat go through it: a unique value would cost a table slot for nothing. The table is bounded:
    when full it starts over, which only costs memory (values stay correct and immutable).
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self._table: dict[Hashable, Any] = {}
        self._limit = limit

    def __call__(self, value: _T) -> _T:
        table = self._table
        found = table.get(value)
        if found is None:
            if len(table) >= self._limit:
                table.clear()
            table[value] = found = value
        return cast(_T, found)


_share = _Shared()
_share_labels: dict[tuple[str, ...], Labels] = {}


_EMPTY_LABELS = Labels()


def _labels(raw: Mapping[str, Any]) -> Labels:
    """Labels shared between pods whose label sets are identical."""
    pairs = sorted((k, v) for k, v in raw.items() if isinstance(k, str) and isinstance(v, str))
    if not pairs:
        return _EMPTY_LABELS
    flat = tuple(_intern(x) for pair in pairs for x in pair)
    found = _share_labels.get(flat)
    if found is None:
        if len(_share_labels) >= 1 << 16:
            _share_labels.clear()
        found = _share_labels[flat] = Labels(flat)
    return found


def _shared_names(names: tuple[str, ...]) -> tuple[str, ...]:
    return _share(names) if names else ()


def _hash_entries(raw: Any, *, timestamps: bool) -> tuple[HashEntry, ...]:
    """Parse a hash annotation. Without `timestamps` the per-pod update times are dropped, so
    the entries of every pod injected from one SidecarSet version are one shared object."""
    entries: list[HashEntry] = []
    for ss, value in parse_object(raw).items():
        if not isinstance(ss, str) or not ss:
            continue
        if isinstance(value, str):
            entries.append(_share(HashEntry(_intern(ss), _intern(value), legacy=True)))
        elif isinstance(value, Mapping):
            sidecars = tuple(_istr(n) for n in _list(value.get("sidecarList")) if isinstance(n, str))
            entries.append(
                HashEntry(
                    _intern(ss),
                    _istr(value.get("hash")),
                    _istr(value.get("controllerRevision")),
                    _istr(value.get("updateTimestamp")) if timestamps else "",
                    _shared_names(sidecars),
                )
            )
    entries.sort()
    # With per-pod timestamps the entries rarely repeat: sharing them would only fill the table.
    return tuple(entries) if timestamps else _share(tuple(entries))


def _inplace_entries(raw: Any) -> tuple[InplaceEntry, ...]:
    entries: list[InplaceEntry] = []
    for ss, value in parse_object(raw).items():
        if not isinstance(ss, str) or not ss or not isinstance(value, Mapping):
            continue
        last = tuple(
            sorted(
                (_intern(c), _istr(resolve(st, "imageID")))
                for c, st in mapping(value, "lastContainerStatuses").items()
                if isinstance(c, str)
            )
        )
        entries.append(
            InplaceEntry(_intern(ss), _istr(value.get("revision")), _istr(value.get("updateTimestamp")), _share(last))
        )
    entries.sort()
    return tuple(entries)


def _containers(raw: Any) -> tuple[tuple[str, str], ...]:
    return _share(tuple((_istr(c.get("name")), _istr(c.get("image"))) for c in _list(raw) if isinstance(c, Mapping)))


def _statuses(raw: Any) -> tuple[ContainerState, ...]:
    out: list[ContainerState] = []
    for cs in _list(raw):
        if not isinstance(cs, Mapping):
            continue
        out.append(
            ContainerState(
                _istr(cs.get("name")),
                _istr(cs.get("image")),
                _istr(cs.get("imageID")),
                cs.get("ready") is True,
                _int(cs.get("restartCount")),
                _istr(resolve(cs, "state", "waiting", "reason")),
            )
        )
    return _share(tuple(out))  # replicas in the same state share one tuple


def _pairs(raw: Any) -> tuple[tuple[str, str], ...]:
    pairs = sorted((_intern(k), _istr(v) or str(v)) for k, v in mapping(raw).items() if isinstance(k, str))
    return tuple(pairs)


def _resources(raw: Any, *, init: bool = False, from_status: bool = False) -> tuple[Resources, ...]:
    """Each container's resources (a status entry's `resources`, or a spec container's own)."""
    out: list[Resources] = []
    for c in _list(raw):
        if not isinstance(c, Mapping):
            continue
        res = mapping(c, "resources")
        if from_status and not res:
            continue  # nothing reported: no evidence either way
        policy = tuple(
            sorted(
                (_istr(resolve(p, "resourceName")), _istr(resolve(p, "restartPolicy")))
                for p in _list(c.get("resizePolicy"))
            )
        )
        out.append(
            _share(
                Resources(
                    _istr(c.get("name")),
                    _share(_pairs(res.get("requests"))),
                    _share(_pairs(res.get("limits"))),
                    _share(policy),
                    init,
                    init and c.get("restartPolicy") == "Always",
                )
            )
        )
    return tuple(out)


_RESIZE_CONDITIONS = frozenset({"PodResizePending", "PodResizeInProgress"})


def project(pod: Any) -> PodProjection:
    """Copy the fields the controller uses out of a raw pod; never raises on bad input."""
    meta, spec, status = mapping(pod, "metadata"), mapping(pod, "spec"), mapping(pod, "status")
    annotations = mapping(meta, "annotations")
    labels = _labels(mapping(meta, "labels"))
    ready, ready_since = False, ""
    upgradable: tuple[str, ...] = ()
    resize: list[tuple[str, str, str]] = []
    for cond in _list(status.get("conditions")):
        cond = mapping(cond)
        kind = cond.get("type")
        if kind in _RESIZE_CONDITIONS and cond.get("status") == "True":
            resize.append((_intern(str(kind)), _istr(cond.get("reason")), _str(cond.get("message"))))
        elif kind == "Ready":
            ready = cond.get("status") == "True"
            ready_since = _istr(cond.get("lastTransitionTime"))
        elif kind == POD_CONDITION_UPGRADABLE:
            upgradable = _share((_istr(cond.get("status")), _istr(cond.get("reason")), _istr(cond.get("message"))))
    injected_raw = annotations.get(ANN_INJECTED_LIST)
    injected = (
        _shared_names(tuple(_intern(n.strip()) for n in injected_raw.split(",") if n.strip()))
        if isinstance(injected_raw, str)
        else ()
    )
    statuses = _statuses(status.get("containerStatuses"))
    return PodProjection(
        namespace=_istr(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        resource_version=_str(meta.get("resourceVersion")),
        labels=labels,
        creation_timestamp=_istr(meta.get("creationTimestamp")),
        deleting=meta.get("deletionTimestamp") is not None,
        phase=_istr(status.get("phase")),
        ready=ready,
        ready_since=ready_since,
        node_name=_istr(spec.get("nodeName")),
        hashes=_hash_entries(annotations.get(ANN_HASH), timestamps=True),
        hashes_without_image=_hash_entries(annotations.get(ANN_HASH_WITHOUT_IMAGE), timestamps=False),
        injected=injected,
        inplace_state=_inplace_entries(annotations.get(ANN_INPLACE_STATE)),
        containers=_containers(spec.get("containers")),
        init_containers=_containers(spec.get("initContainers")),
        container_statuses=statuses,
        init_statuses=_statuses(status.get("initContainerStatuses")),
        total_restarts=sum(cs.restart_count for cs in statuses),
        upgradable_condition=upgradable,
        hot_working=_hot_working(annotations.get(ANN_WORKING_HOT)),
        hot_versions=_hot_versions(annotations),
        resources=_share(_resources(spec.get("containers")) + _resources(spec.get("initContainers"), init=True)),
        applied_resources=_share(
            _resources(status.get("containerStatuses"), from_status=True)
            + _resources(status.get("initContainerStatuses"), init=True, from_status=True)
        ),
        resize_conditions=tuple(sorted(resize)),
        overrides=_text(annotations.get(ANN_OVERRIDES)),
        overrides_env=_text(annotations.get(ANN_OVERRIDES_ENV_APPLIED)),
    )


def _text(value: Any) -> str | None:
    return _intern(value) if isinstance(value, str) else None


def _hot_working(raw: Any) -> tuple[tuple[str, str], ...]:
    pairs = sorted(
        (_intern(k), _istr(v)) for k, v in parse_object(raw).items() if isinstance(k, str) and isinstance(v, str)
    )
    return _share(tuple(pairs)) if pairs else ()


def _hot_versions(annotations: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    versions: dict[str, list[str]] = {}
    for key, value in annotations.items():
        for slot, prefix in enumerate((ANN_VERSION_PREFIX, ANN_VERSION_ALT_PREFIX)):
            if isinstance(key, str) and key.startswith(prefix) and isinstance(value, str):
                versions.setdefault(key[len(prefix) :], ["", ""])[slot] = value
    return tuple(sorted((_intern(c), _istr(v), _istr(a)) for c, (v, a) in versions.items()))
