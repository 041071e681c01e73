"""The one SidecarSet model: what the webhook, the controller, the planner, status, revisions and
validation read of a SidecarSet object.

The API server may or may not have applied defaults (a manifest given to the CLI never has), so
every default of Kruise's SidecarSet webhook is applied when reading (sidecarsets.spec.defaults): an
object with and without server-side defaults behaves the same.

Two modes (sidecarsets.spec.reading): strict for injection, where a structural problem raises
ModelError naming the field; tolerant for objects read back from the cluster, where nothing raises,
unknown fields are kept (`obj` is the object as received) and problems are reported in `problems`.
Finer checks (name formats, conflicts, update rules) belong to validation, which runs before an
object is accepted.

The hashes are computed from the spec exactly as received, so that they equal what anything else
computes with `sidecarsets.spec.hashing` from the same object.

A NamespacedSidecarSet is the same model, `name` being its key `<namespace>/<name>` in every annotation,
hash, cache and metric (`object_name` and `namespace` address the object); its scope is its namespace
unless labelled `sidecarctl.io/namespaced-sidecarsets: disabled` (or its labels are unknown).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as _derived
from typing import Any

from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.spec import hashing, names, selectors, sidecar
from sidecarsets.spec.conversion import is_v1beta1
from sidecarsets.spec.reading import (
    ModelError,
    Problem,
    Reader,
    collision_count,
    first_problem,
    history_limit,
    is_int,
    namespace_scope,
    only_name_label,
    own_namespace,
    own_scope,
    type_name,
)
from sidecarsets.spec.sidecar import MetadataPatch, SidecarContainer, read_containers, read_patch_pod_metadata
from sidecarsets.spec.strategies import RevisionPin, UpdateStrategy, read_revision_pin, read_update_strategy
from sidecarsets.values.jsontemplate import JsonTemplate

ACCEPTED_API_VERSIONS = (
    names.API_VERSION,
    names.API_VERSION_V1BETA1,
    names.KRUISE_API_VERSION,
    names.KRUISE_API_VERSION_V1BETA1,
)
_IMAGE_FIELD = re.compile(r"^spec\.containers\[\d+\]\.image$")

__all__ = ["ACCEPTED_API_VERSIONS", "ModelError", "Problem", "SidecarSet", "namespace_of", "object_key", "status_path"]


@dataclass(frozen=True, slots=True)
class SidecarSet:
    """An immutable view of one SidecarSet object; build it with `SidecarSet.from_object`."""

    name: str  # the key: `name` for a SidecarSet, `<namespace>/<name>` for a NamespacedSidecarSet
    obj: JsonObj
    spec: JsonObj
    uid: str
    resource_version: str
    generation: int
    creation_timestamp: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    status: Mapping[str, Any]
    selector: JsonObj | None
    namespace_selector: JsonObj | None
    hash: str
    hash_without_image: str
    hash_without_resources: str  # images and resources blanked (sidecarsets.rollout.resize)
    injection_paused: bool
    injection_revision: RevisionPin | None
    update_strategy: UpdateStrategy
    containers: tuple[SidecarContainer, ...]
    init_containers: tuple[SidecarContainer, ...]
    volumes: tuple[JsonObj, ...]
    image_pull_secrets: tuple[JsonObj, ...]
    patch_pod_metadata: tuple[MetadataPatch, ...]
    revision_history_limit: int
    latest_revision: str | None
    collision_count: int
    overrides: tuple[sidecar.OverrideBounds, ...] = ()  # spec.overrides: what pods may change by annotation
    problems: tuple[Problem, ...] = ()
    namespace: str = ""  # a NamespacedSidecarSet's namespace; "" for a (cluster-scoped) SidecarSet
    object_name: str = ""  # metadata.name (the key without the namespace)
    # Derived once from the fields above: the engine asks for them for every pod, and a
    # SidecarSet is read once per change.
    _container_names: tuple[str, ...] = _derived(init=False, repr=False, compare=False)
    _all_container_names: frozenset[str] = _derived(init=False, repr=False, compare=False)
    _names_in_pod: dict[str, tuple[str, ...]] = _derived(init=False, repr=False, compare=False)
    _volumes_by_name: dict[str, tuple[JsonObj, JsonTemplate]] = _derived(init=False, repr=False, compare=False)
    _pull_secrets: tuple[JsonTemplate, ...] = _derived(init=False, repr=False, compare=False)
    _pod_matcher: Callable[[Mapping[str, str]], bool] = _derived(init=False, repr=False, compare=False)
    _namespace_matcher: Callable[[Mapping[str, str]], bool] = _derived(init=False, repr=False, compare=False)
    _namespace_name_only: bool = _derived(init=False, repr=False, compare=False)
    # The order in which a pod gets the sidecars of several SidecarSets, as Kruise's: those scoped by
    # namespace name first, then the cluster-wide ones; by name within each (selectors.names_namespaces).
    injection_order: tuple[int, str] = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def derive(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        derive(
            "_container_names",
            tuple(c.name for c in self.containers) + tuple(c.name for c in self.init_containers if c.native),
        )
        derive("_all_container_names", frozenset(c.name for c in self.containers + self.init_containers))
        in_pod: dict[str, tuple[str, ...]] = {}
        for c in self.init_containers:
            in_pod[c.name] = c.names_in_pod
        for c in self.containers:  # a container wins over an init container of its name, as before
            in_pod[c.name] = c.names_in_pod
        derive("_names_in_pod", in_pod)
        by_name: dict[str, tuple[JsonObj, JsonTemplate]] = {}
        for vol in self.volumes:
            by_name.setdefault(vol["name"], (vol, JsonTemplate(vol)))
        derive("_volumes_by_name", by_name)
        derive("_pull_secrets", tuple(JsonTemplate(s) for s in self.image_pull_secrets))
        selector = None if selectors.is_empty(self.selector) else self.selector
        derive("_pod_matcher", selectors.matcher(selector))
        sel = self.namespace_selector
        if self.namespace:
            derive("_namespace_matcher", own_namespace(self.namespace))
            derive("_namespace_name_only", False)  # the disabled label decides too: labels must be known
            # After every cluster SidecarSet: a pod gets the cluster's sidecars first, its namespace's after.
            derive("injection_order", (2, self.name))
            return
        derive("_namespace_matcher", selectors.matcher(sel))
        derive("_namespace_name_only", sel is not None and only_name_label(sel))
        derive("injection_order", (0 if selectors.names_namespaces(sel, names.NS_NAME_LABEL) else 1, self.name))

    @classmethod
    def from_object(cls, obj: Any, *, tolerant: bool = False) -> SidecarSet:
        """Read a SidecarSet object.

        Strict (default): raise ModelError when it cannot be used for injection. Tolerant: never
        raise; what cannot be read is empty and listed in `problems`.
        """
        reader = Reader(tolerant=tolerant)
        if not isinstance(obj, Mapping):
            reader.fail("", f"a SidecarSet must be an object, not {type_name(obj)}")
            obj = {}
        metadata = reader.object(obj.get("metadata"), "metadata", required=True)
        namespace = namespace_of(obj)
        _check_type(reader, obj, namespaced=bool(namespace))
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            reader.fail("metadata.name", "metadata.name must be a non-empty string")
            name = ""
        spec = reader.object(obj.get("spec"), "spec", required=True)
        status = reader.object(obj.get("status"), "status")
        selector = reader.optional_object(spec.get("selector"), "spec.selector")
        if namespace:
            ns_selector: JsonObj | None = own_scope(reader, spec, namespace)
        else:
            ns_selector = namespace_scope(reader, spec, beta=is_v1beta1(obj))
        init_containers = read_containers(reader, spec.get("initContainers"), "spec.initContainers", init=True)
        containers = read_containers(reader, spec.get("containers"), "spec.containers", init=False)
        _check_names(reader, containers, init_containers)
        _check_images(reader, spec.get("containers"))
        injection = reader.object(spec.get("injectionStrategy"), "spec.injectionStrategy")
        generation = metadata.get("generation", 0)
        latest = status.get("latestRevision")
        return cls(
            name=names.sidecarset_key(name, namespace),
            namespace=namespace,
            object_name=name,
            obj=obj if isinstance(obj, dict) else dict(obj),
            spec=spec,
            uid=str(metadata.get("uid") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
            generation=generation if is_int(generation) else 0,
            creation_timestamp=str(metadata.get("creationTimestamp") or ""),
            labels=mapping(metadata, "labels"),
            annotations=mapping(metadata, "annotations"),
            status=status,
            selector=selector,
            namespace_selector=ns_selector,
            hash=hashing.spec_hash(spec),
            hash_without_image=hashing.spec_hash_without_image(spec),
            hash_without_resources=hashing.spec_hash_without_image_and_resources(spec),
            injection_paused=reader.boolean(injection.get("paused"), "spec.injectionStrategy.paused"),
            injection_revision=read_revision_pin(reader, injection),
            update_strategy=read_update_strategy(reader, spec.get("updateStrategy")),
            containers=containers,
            init_containers=init_containers,
            volumes=reader.named_objects(spec.get("volumes"), "spec.volumes"),
            image_pull_secrets=reader.named_objects(spec.get("imagePullSecrets"), "spec.imagePullSecrets"),
            patch_pod_metadata=read_patch_pod_metadata(reader, spec.get("patchPodMetadata")),
            revision_history_limit=history_limit(reader, spec.get("revisionHistoryLimit")),
            latest_revision=latest if isinstance(latest, str) and latest else None,
            collision_count=collision_count(reader, status.get("collisionCount")),
            overrides=sidecar.read_overrides(reader, spec.get("overrides")),
            problems=tuple(reader.problems),
        )

    # -- questions -------------------------------------------------------------------------------
    @property
    def namespaced(self) -> bool:
        """A NamespacedSidecarSet (a tenant's), not a cluster SidecarSet."""
        return bool(self.namespace)

    @property
    def kind(self) -> str:
        return names.NAMESPACED_KIND if self.namespace else names.KIND

    @property
    def container_names(self) -> tuple[str, ...]:
        """The sidecars a pod carries for this SidecarSet: containers and native-sidecar init containers."""
        return self._container_names

    @property
    def all_container_names(self) -> frozenset[str]:
        """Every name this SidecarSet puts into a pod, init containers included."""
        return self._all_container_names

    def names_in_pod(self, name: str) -> tuple[str, ...]:
        """The container names sidecar `name` takes in a pod: a HotUpgrade one (a container or a
        native-sidecar init container) is injected as its `-1`/`-2` pair, any other under its name."""
        return self._names_in_pod.get(name, (name,))

    @property
    def all_names_in_pod(self) -> frozenset[str]:
        """Every container name this SidecarSet's sidecars take in a pod (`names_in_pod` of each),
        plain init containers included."""
        return frozenset(n for taken in self._names_in_pod.values() for n in taken)

    @property
    def container_names_in_pod(self) -> frozenset[str]:
        """The containers that stay in a pod for this SidecarSet (`container_names`, each as it is
        named in the pod: both of a HotUpgrade pair); the ones the rollout and the status count."""
        sidecars = (*self.containers, *(c for c in self.init_containers if c.native))
        return frozenset(n for c in sidecars for n in c.names_in_pod)

    @property
    def sidecar_list(self) -> list[str]:
        """Sorted logical sidecar names, as recorded in the pod's hash annotation."""
        return sorted(set(self._container_names))

    @property
    def hot_names(self) -> list[str]:
        return [c.name for c in self.containers if c.hot]

    @property
    def cold_names(self) -> list[str]:
        return [c.name for c in self.containers if not c.hot]

    @property
    def native_init_names(self) -> list[str]:
        """Init containers with `restartPolicy: Always` run for the pod's lifetime (native sidecars);
        the HotUpgrade ones are in `hot_init_names` (the pod has their -1/-2 pair)."""
        return [c.name for c in self.init_containers if c.native and not c.hot]

    @property
    def hot_init_names(self) -> list[str]:
        """Native-sidecar init containers with HotUpgrade: injected as a -1/-2 pair of init containers."""
        return [c.name for c in self.init_containers if c.native and c.hot]

    @property
    def cold_images(self) -> dict[str, str]:
        """Cold sidecar name -> image, for the ones that have an image."""
        return {c.name: c.image for c in self.containers if not c.hot and c.image is not None}

    @property
    def native_images(self) -> dict[str, str]:
        """Native-sidecar init container name -> image: rolled in place like the containers."""
        return {c.name: c.image for c in self.init_containers if c.native and not c.hot and c.image is not None}

    @property
    def custom_version(self) -> str:
        """The SidecarSet's custom version (v1beta1 `spec.customVersion`, v1alpha1 a label), or ""."""
        if self.namespace or is_v1beta1(self.obj):
            value = self.spec.get("customVersion")
            return value if isinstance(value, str) else ""
        return str(self.labels.get(names.SS_LABEL_CUSTOM_VERSION) or "")

    @property
    def canary_base(self) -> str | None:
        """The base SidecarSet this canary replaces in the pods it selects, or None for a non-canary."""
        base = self.annotations.get(names.ANN_BASE)
        if self.annotations.get(names.ANN_CANARY) == "true" and isinstance(base, str) and base:
            return base
        return None

    def problem(self, *fields: str, exact: bool = False) -> Problem | None:
        """The first problem on any of `fields` or below them (only on them with `exact`)."""
        return first_problem(self.problems, *fields, exact=exact)

    def rollout_problem(self) -> Problem | None:
        """Why the controller cannot roll sidecar images out under this spec, or None.

        A strategy it cannot read, or a sidecar without an image, stops the rollout: rolling on
        guessed values could exceed what the user allowed.
        """
        found = self.problem("spec.updateStrategy")
        if found is not None:
            return found
        return next((p for p in self.problems if _IMAGE_FIELD.match(p.field)), None)

    def volume(self, name: str) -> JsonObj | None:
        """The SidecarSet's volume called `name`, if it defines one."""
        found = self._volumes_by_name.get(name)
        return None if found is None else found[0]

    def fresh_volume(self, name: str) -> JsonObj | None:
        """A deep copy of the volume called `name`, for a pod to own; None if there is no such volume."""
        found = self._volumes_by_name.get(name)
        if found is None:
            return None
        out: JsonObj = found[1].fresh()
        return out

    def fresh_image_pull_secrets(self) -> list[JsonObj]:
        """Deep copies of `image_pull_secrets`, for a pod to own."""
        return [template.fresh() for template in self._pull_secrets]

    def matches_namespace(self, namespace: str, namespace_labels: Mapping[str, str] | None) -> bool:
        """Whether pods in `namespace` are in scope.

        With the labels unknown (None) only a selector on the namespace name label can be decided,
        from the name itself; any other selector does not match: unsure never widens injection.
        """
        if self.namespace_selector is None:
            return True
        if namespace_labels is None:
            return self._namespace_name_only and self._namespace_matcher({names.NS_NAME_LABEL: namespace})
        # The API server always sets this label to the namespace's name.
        return self._namespace_matcher({**namespace_labels, names.NS_NAME_LABEL: namespace})

    def matches_pod(self, pod_labels: Mapping[str, str]) -> bool:
        """Whether the pod selector matches; an absent or empty selector matches no pod."""
        return self._pod_matcher(pod_labels)


def namespace_of(obj: Mapping[str, Any]) -> str:
    """A NamespacedSidecarSet's namespace, or "" for a SidecarSet. The kind decides when it is given: a
    SidecarSet manifest that carries a namespace (the API server drops it) is still a SidecarSet."""
    meta = obj.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    kind = obj.get("kind")
    if not isinstance(namespace, str) or (kind is not None and kind != names.NAMESPACED_KIND):
        return ""
    return namespace


def object_key(obj: Mapping[str, Any] | None) -> str:
    """The key (`SidecarSet.name`) of a SidecarSet or NamespacedSidecarSet object, without reading it."""
    meta = (obj or {}).get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return names.sidecarset_key(str(name or ""), namespace_of(obj or {}))


def status_path(ss: SidecarSet) -> str:
    """The status subresource of the object `ss` was read from (the version the manager writes)."""
    if ss.namespace:
        base = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/namespaces/{ss.namespace}/{names.NAMESPACED_PLURAL}"
        return f"{base}/{ss.object_name}/status"
    return f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}/{ss.name}/status"


def _check_type(reader: Reader, obj: Mapping[str, Any], *, namespaced: bool) -> None:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    accepted = (names.API_VERSION_V1BETA1,) if namespaced else ACCEPTED_API_VERSIONS
    expected = names.NAMESPACED_KIND if namespaced else names.KIND
    if api_version is not None and api_version not in accepted:
        reader.fail("apiVersion", f"apiVersion: {api_version!r} is not a {expected} version ({' or '.join(accepted)})")
    if kind is not None and kind != expected:
        reader.fail("kind", f"kind: {kind!r} is not {expected}")


def _check_names(
    reader: Reader, containers: tuple[SidecarContainer, ...], init_containers: tuple[SidecarContainer, ...]
) -> None:
    seen: dict[str, str] = {}
    for field, group in (("spec.containers", containers), ("spec.initContainers", init_containers)):
        for i, sc in enumerate(group):
            where = f"{field}[{i}].name"
            if sc.name in seen:
                reader.fail(where, f"{where}: container name {sc.name!r} is already used by {seen[sc.name]}")
            seen[sc.name] = where


def _check_images(reader: Reader, raw_containers: Any) -> None:
    """A sidecar without an image cannot be rolled (validation refuses it; older objects may have one)."""
    for i, raw in enumerate(raw_containers if isinstance(raw_containers, list) else ()):
        image = raw.get("image") if isinstance(raw, dict) else None
        if isinstance(raw, dict) and (not isinstance(image, str) or not image):
            where = f"spec.containers[{i}].image"
            reader.fail(where, f"{where}: must be a non-empty string", advisory=True)
