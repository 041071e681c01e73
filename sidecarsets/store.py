"""The in-memory view of SidecarSets, namespaces and revisions that the webhook reads.

The webhook must never call the API server while it answers an admission: a slow or
unreachable API server would turn into slow or failed pod creations everywhere. Watches feed
this store; every change publishes a new immutable `Snapshot`, and a request reads whichever
snapshot is current when it starts. A SidecarSet edit is visible to the next admission as soon
as the watch event arrives (milliseconds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.model import ModelError, SidecarSet, object_key
from sidecarsets.spec.podindex import PodIndex

log = logging.getLogger(__name__)

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Snapshot:
    """One consistent view; never mutated after it is published."""

    sidecarsets: tuple[SidecarSet, ...] = ()
    # SidecarSet key → object as stored, including ones the model could not read (for validation);
    # NamespacedSidecarSets under `<namespace>/<name>`.
    objects: Mapping[str, JsonObj] = field(default_factory=lambda: _EMPTY)
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: _EMPTY)
    # ControllerRevision name → object, for injecting a pinned revision.
    revisions: Mapping[str, JsonObj] = field(default_factory=lambda: _EMPTY)
    # The SidecarSets above by what a pod must carry to be selected: a pod's cost follows the
    # SidecarSets that could select it, not all of them.
    # Built from `sidecarsets` when not given (the store passes the one it keeps across namespace changes).
    index: PodIndex | None = field(default=None, compare=False)
    pinning: bool = field(init=False, compare=False)  # some SidecarSet pins new pods to a revision
    by_name: Mapping[str, SidecarSet] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        index = self.index
        if index is None or (index.sidecarsets is not self.sidecarsets and index.sidecarsets != self.sidecarsets):
            index = PodIndex(self.sidecarsets)
            object.__setattr__(self, "index", index)
        object.__setattr__(self, "pinning", index.pinning)
        object.__setattr__(self, "by_name", index.by_name)

    def sidecarsets_for(self, namespace: str, pod_labels: Mapping[str, str]) -> tuple[SidecarSet, ...]:
        """The SidecarSets that may select such a pod (PodIndex): the others cannot."""
        assert self.index is not None  # set by __post_init__
        return self.index.candidates(namespace, pod_labels)


class LayeredNamespaces(Mapping[str, Mapping[str, str]]):
    """Namespace labels as published: the last full copy, with the few changes since laid over it.

    A snapshot must not see later changes, so the store used to copy every namespace into each one;
    with 10,000 namespaces and one relabelled before every admission that copy was a third of the
    admission's time (bench/bench_many.py). Now a snapshot copies only the changes since the last
    full copy, and the store folds them into a new one once there are FOLD_AFTER of them.
    """

    __slots__ = ("_base", "_len", "_over")

    def __init__(
        self, base: Mapping[str, Mapping[str, str]], over: Mapping[str, Mapping[str, str] | None], size: int
    ) -> None:
        self._base = base
        self._over = over  # name -> labels, or None: deleted since the base was copied
        self._len = size

    def __getitem__(self, name: str) -> Mapping[str, str]:
        if name in self._over:
            labels = self._over[name]
            if labels is None:
                raise KeyError(name)
            return labels
        return self._base[name]

    def get(self, name: str, default: Any = None) -> Any:
        labels = self._over.get(name, _ABSENT) if self._over else _ABSENT
        if labels is _ABSENT:
            return self._base.get(name, default)
        return default if labels is None else labels

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None if isinstance(name, str) else False

    def __iter__(self) -> Iterator[str]:
        over = self._over
        yield from (name for name in self._base if name not in over)
        yield from (name for name, labels in over.items() if labels is not None)

    def __len__(self) -> int:
        return self._len


_ABSENT: Any = object()
FOLD_AFTER = 256  # changes laid over a full copy before the next full copy: a copy of 10,000 per 256 changes


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def namespace_labels(obj: JsonObj) -> dict[str, str]:
    """The projection the store keeps per namespace: its labels, with the name label guaranteed."""
    meta = obj.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    labels.setdefault("kubernetes.io/metadata.name", str(meta.get("name") or ""))
    return labels


class TemplateStore:
    """Mutated only by informer handlers on the event loop; readers take `snapshot`.

    Handlers only mark the store dirty; the next reader builds the new snapshot. An initial
    list of thousands of namespaces therefore costs one copy, not one per namespace.
    """

    def __init__(self) -> None:
        self._snapshot = Snapshot()
        self._dirty = False
        # Bumped on every change: answers computed under an older version are stale.
        self.version = 0
        self._models: dict[str, SidecarSet] = {}
        self._objects: dict[str, JsonObj] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self._revisions: dict[str, JsonObj] = {}
        self._index: PodIndex | None = None  # the SidecarSets' index: kept while only namespaces change
        # What the last snapshot published of each part, kept while that part does not change.
        self._objects_view: Mapping[str, JsonObj] | None = None
        self._revisions_view: Mapping[str, JsonObj] | None = None
        self._ns_base: Mapping[str, Mapping[str, str]] = _EMPTY  # the last full copy of the namespaces
        self._ns_changes: dict[str, Mapping[str, str] | None] = {}  # since that copy; None: deleted

    @property
    def snapshot(self) -> Snapshot:
        if self._dirty:
            self._dirty = False
            self._snapshot = self._build()
        return self._snapshot

    def _publish(self) -> None:
        self._dirty = True
        self.version += 1

    def _build(self) -> Snapshot:
        if self._index is None:
            ordered = tuple(sorted(self._models.values(), key=lambda s: (s.creation_timestamp, s.name)))
            self._index = PodIndex(ordered)
        if self._objects_view is None:
            self._objects_view = MappingProxyType(dict(self._objects))
        if self._revisions_view is None:
            self._revisions_view = MappingProxyType(dict(self._revisions))
        if len(self._ns_changes) >= FOLD_AFTER:
            self._ns_base, self._ns_changes = MappingProxyType(dict(self._namespaces)), {}
        namespaces: Mapping[str, Mapping[str, str]] = (
            LayeredNamespaces(self._ns_base, dict(self._ns_changes), len(self._namespaces))
            if self._ns_changes
            else self._ns_base
        )
        return Snapshot(
            sidecarsets=self._index.sidecarsets,
            index=self._index,
            objects=self._objects_view,
            namespaces=namespaces,
            revisions=self._revisions_view,
        )

    # -- informer handlers: (event type, old, new) ---------------------------------------------
    def on_sidecarset(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        """A SidecarSet or NamespacedSidecarSet event: both kinds share the store, by key."""
        name = object_key(new or old)
        if kind == "DELETED" or new is None:
            self._models.pop(name, None)
            self._objects.pop(name, None)
        else:
            self._objects[name] = new
            try:
                self._models[name] = SidecarSet.from_object(new)
            except ModelError as e:
                # Keep injecting with the last good version rather than dropping the sidecar.
                log.error("SidecarSet %s is unusable, keeping its previous version: %s", name, e)
        self._index = None
        self._objects_view = None
        self._publish()

    def on_namespace(self, kind: str, old: Mapping[str, str] | None, new: Mapping[str, str] | None) -> None:
        labels = new if new is not None else old
        name = (labels or {}).get("kubernetes.io/metadata.name", "")
        if kind == "DELETED" or new is None:
            self._namespaces.pop(name, None)
            self._ns_changes[name] = None
        else:
            self._namespaces[name] = new
            self._ns_changes[name] = new
        self._publish()

    def on_revision(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = _name(new or old)
        if kind == "DELETED" or new is None:
            self._revisions.pop(name, None)
        else:
            self._revisions[name] = new
        self._revisions_view = None
        self._publish()
