"""The records a pod projection is made of: hash and in-place-state entries, container states, labels.

Each is immutable and hashable, so pods of one workload can share one instance (sidecarsets.pods.projection
interns them as it reads a pod). They say what a projection holds; how a pod's JSON becomes them, and
the memory tuning of that reading, stay with the reading.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple


class HashEntry(NamedTuple):
    """One SidecarSet's entry in the pod's hash annotation.

    Every field is kept (not only the hash) because an upgrade rewrites the whole annotation and
    the other SidecarSets' entries must survive it. `legacy` marks the old `{ss: "hash"}` form,
    which is written back in that form.
    """

    sidecarset: str
    hash: str
    controller_revision: str = ""
    update_timestamp: str = ""
    sidecar_list: tuple[str, ...] = ()
    legacy: bool = False


class InplaceEntry(NamedTuple):
    """One SidecarSet's record of the image IDs its sidecars ran before an in-place upgrade."""

    sidecarset: str
    revision: str
    update_timestamp: str
    last_image_ids: tuple[tuple[str, str], ...]  # (container, imageID)


class ContainerState(NamedTuple):
    """What the kubelet reports for one container: the evidence that an upgrade has landed."""

    name: str
    image: str
    image_id: str
    ready: bool
    restart_count: int
    waiting: str = ""  # state.waiting.reason (ErrImagePull, CrashLoopBackOff...): why it is not running


class Resources(NamedTuple):
    """One container's resources, as its spec asks or as the kubelet reports them applied.

    Quantities are kept as the API server wrote them ((resource, quantity) pairs in name order);
    comparisons parse them (sidecarsets.rollout.resize), so `1Gi` and `1024Mi` are one value.
    `native` marks an init container that is a native sidecar (restartPolicy Always): the only
    init containers whose resources count for a running pod and can be resized.
    """

    name: str
    requests: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, str], ...] = ()
    resize_policy: tuple[tuple[str, str], ...] = ()  # (resource, restartPolicy) as the spec sets them
    init: bool = False
    native: bool = False


class Labels(Mapping[str, str]):
    """A pod's labels: read-only, stored as one flat sorted (key, value, key, value...) tuple.

    A dict of ten labels costs about 500 bytes per pod; the flat tuple costs about 200, and
    pods with identical label sets share one instance. Pods carry few labels, so a linear
    scan is as fast as hashing here.
    """

    __slots__ = ("_flat",)

    def __init__(self, flat: tuple[str, ...] = ()) -> None:
        self._flat = flat

    def __getitem__(self, key: str) -> str:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == key:
                return flat[i + 1]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        flat = self._flat
        return any(flat[i] == key for i in range(0, len(flat), 2))

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat[::2])

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Labels):
            return self._flat == other._flat
        return dict(self) == other if isinstance(other, Mapping) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._flat)

    def __repr__(self) -> str:
        return f"Labels({dict(self)!r})"
