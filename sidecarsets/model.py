"""A SidecarSet read once into the shape the injection engine and the controller consume.

The API server may or may not have applied defaults (a manifest given to the CLI never has),
so every default of Kruise's SidecarSet webhook is applied here, when reading, and nowhere else:
an object with and without server-side defaults behaves the same. Structural problems that make
an object unusable raise ModelError naming the field; finer checks (name formats, conflicts,
update rules) belong to validation, which runs before an object is accepted.

The hashes are computed from the spec exactly as received, so that they equal what anything else
computes with `sidecarsets.hashing` from the same object.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as _derived  # `field` names a field path throughout this module
from typing import Any, Literal, TypeVar

import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets import hashing, names, selectors

InjectPolicy = Literal["BeforeAppContainer", "AfterAppContainer"]
UpgradeType = Literal["ColdUpgrade", "HotUpgrade"]
PatchPolicy = Literal["Retain", "Overwrite", "MergePatchJson"]

BEFORE_APP: InjectPolicy = "BeforeAppContainer"
AFTER_APP: InjectPolicy = "AfterAppContainer"
_INJECT_POLICIES: tuple[InjectPolicy, ...] = (BEFORE_APP, AFTER_APP)
_UPGRADE_TYPES: tuple[UpgradeType, ...] = ("ColdUpgrade", "HotUpgrade")
_PATCH_POLICIES: tuple[PatchPolicy, ...] = ("Retain", "Overwrite", "MergePatchJson")
_SHARE_POLICIES = ("enabled", "disabled")
_T = TypeVar("_T", bound=str)

# SidecarContainer fields that are not corev1.Container fields: they never reach the pod.
_SIDECAR_ONLY_FIELDS = frozenset(
    {
        "podInjectPolicy",
        "upgradeStrategy",
        "shareVolumePolicy",
        "shareVolumeDevicePolicy",
        "transferEnv",
        "resourcesPolicy",
    }
)

_SUBSCRIPTED_PATH = re.compile(r"^(metadata\.labels|metadata\.annotations)\['([^']*)'\]$")
ACCEPTED_API_VERSIONS = (names.API_VERSION, names.KRUISE_API_VERSION)


class ModelError(ValueError):
    """A SidecarSet object too malformed to inject from; the message names the field."""


# orjson would silently turn these into other JSON values; with these options it refuses them instead.
_EXACT_DUMPS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS


def _shares_nothing(value: Any) -> bool:
    """No dict or list occurs twice in `value` (YAML anchors give shared ones; a JSON round trip splits them)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is not dict and kind is not list:
            continue
        if id(item) in seen:
            return False
        seen.add(id(item))
        stack.extend(item.values() if kind is dict else item)
    return True


class JsonTemplate:
    """A JSON value the engine puts into every injected pod, copied per pod without `copy.deepcopy`.

    Each pod must get objects of its own (a caller may change the patch), and a deep copy per pod
    is the injection's largest cost. The value is serialized on first use; each copy parses the
    bytes again, several times faster. A value the round trip would not reproduce exactly (a YAML
    date or NaN, shared subtrees) keeps the deep copy. The value must not change afterwards.
    """

    __slots__ = ("_raw", "_ready", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._raw: bytes | None = None
        self._ready = False

    def fresh(self) -> Any:
        """A deep copy of the value, sharing nothing with it or with earlier copies."""
        if not self._ready:  # on first use: SidecarSets read only to be reconciled never pay for it
            self._raw = _exact_json(self.value)
            self._ready = True
        raw = self._raw
        return copy.deepcopy(self.value) if raw is None else orjson.loads(raw)


def _exact_json(value: Any) -> bytes | None:
    """`value` as JSON, when parsing that gives back an equal value with nothing shared; else None."""
    try:
        raw = orjson.dumps(value, option=_EXACT_DUMPS)
    except TypeError:  # orjson.JSONEncodeError: a type or an integer JSON cannot carry
        return None
    return raw if orjson.loads(raw) == value and _shares_nothing(value) else None


@dataclass(frozen=True, slots=True)
class TransferEnv:
    """Env vars copied from an app container of the pod into the sidecar.

    The source is `source_container_name`, or read from the pod at `source_field_path`
    (`metadata.name`, `metadata.labels['k']`, `metadata.annotations['k']`).
    """

    source_container_name: str | None
    source_field_path: str | None
    env_names: tuple[str, ...]
    env_name_set: frozenset[str] = _derived(init=False, repr=False, compare=False)
    _subscript: tuple[str, str] | None = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_name_set", frozenset(self.env_names))
        m = None if self.source_field_path is None else _SUBSCRIPTED_PATH.match(self.source_field_path)
        object.__setattr__(self, "_subscript", None if m is None else (m.group(1).split(".", 1)[1], m.group(2)))

    def source_in(self, pod_metadata: Mapping[str, Any]) -> str | None:
        """The source container name for this pod, or None when the pod does not say."""
        if self.source_field_path is None:
            return self.source_container_name
        if self.source_field_path == "metadata.name":
            value = pod_metadata.get("name")
            return value if isinstance(value, str) and value else None
        if self._subscript is None:
            return None
        section_name, key = self._subscript
        section = pod_metadata.get(section_name)
        if not isinstance(section, Mapping):
            return None
        value = section.get(key)
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class MetadataPatch:
    """One `patchPodMetadata` entry: annotations put on every injected pod."""

    annotations: tuple[tuple[str, str], ...]
    policy: PatchPolicy


@dataclass(frozen=True, slots=True)
class SidecarContainer:
    """A sidecar container with its SidecarSet-only settings read out and defaulted.

    `container` is the plain corev1.Container that goes into the pod (the SidecarSet-only
    fields removed); it is shared with the SidecarSet object, so copy it before changing it
    (`fresh_container` gives a copy). What the engine reads for every pod is derived once, here.
    """

    name: str
    container: JsonObj
    inject_policy: InjectPolicy
    upgrade_type: UpgradeType
    share_volumes: bool
    share_volume_devices: bool
    transfer_env: tuple[TransferEnv, ...]
    native: bool
    has_resources_policy: bool
    _volume_names: tuple[str, ...] = _derived(init=False, repr=False, compare=False)
    _template: JsonTemplate = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out: list[str] = []
        for key in ("volumeMounts", "volumeDevices"):
            for item in self.container.get(key) or []:
                name = item.get("name")
                if isinstance(name, str) and name not in out:
                    out.append(name)
        object.__setattr__(self, "_volume_names", tuple(out))
        object.__setattr__(self, "_template", JsonTemplate(self.container))

    def mounted_volume_names(self) -> tuple[str, ...]:
        """Names of the volumes this container uses through volumeMounts or volumeDevices."""
        return self._volume_names

    def fresh_container(self) -> JsonObj:
        """A deep copy of `container`, for a pod to own."""
        out: JsonObj = self._template.fresh()
        return out


@dataclass(frozen=True, slots=True)
class SidecarSet:
    """An immutable view of one SidecarSet object; build it with `SidecarSet.from_object`."""

    name: str
    obj: JsonObj
    spec: JsonObj
    resource_version: str
    generation: int
    creation_timestamp: str
    labels: Mapping[str, str]
    selector: JsonObj | None
    namespace_selector: JsonObj | None
    hash: str
    hash_without_image: str
    injection_paused: bool
    containers: tuple[SidecarContainer, ...]
    init_containers: tuple[SidecarContainer, ...]
    volumes: tuple[JsonObj, ...]
    image_pull_secrets: tuple[JsonObj, ...]
    patch_pod_metadata: tuple[MetadataPatch, ...]
    latest_revision: str | None
    # Derived once from the fields above (again by `dataclasses.replace`): the engine asks for
    # them for every pod, and a SidecarSet is read once per change.
    _container_names: tuple[str, ...] = _derived(init=False, repr=False, compare=False)
    _all_container_names: frozenset[str] = _derived(init=False, repr=False, compare=False)
    _volumes_by_name: dict[str, tuple[JsonObj, JsonTemplate]] = _derived(init=False, repr=False, compare=False)
    _pull_secrets: tuple[JsonTemplate, ...] = _derived(init=False, repr=False, compare=False)
    _pod_matcher: Callable[[Mapping[str, str]], bool] = _derived(init=False, repr=False, compare=False)
    _namespace_matcher: Callable[[Mapping[str, str]], bool] = _derived(init=False, repr=False, compare=False)
    _namespace_name_only: bool = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def derive(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        derive(
            "_container_names",
            tuple(c.name for c in self.containers) + tuple(c.name for c in self.init_containers if c.native),
        )
        derive("_all_container_names", frozenset(c.name for c in self.containers + self.init_containers))
        by_name: dict[str, tuple[JsonObj, JsonTemplate]] = {}
        for vol in self.volumes:
            by_name.setdefault(vol["name"], (vol, JsonTemplate(vol)))
        derive("_volumes_by_name", by_name)
        derive("_pull_secrets", tuple(JsonTemplate(s) for s in self.image_pull_secrets))
        selector = None if selectors.is_empty(self.selector) else self.selector
        derive("_pod_matcher", selectors.matcher(selector))
        sel = self.namespace_selector
        derive("_namespace_matcher", selectors.matcher(sel))
        derive("_namespace_name_only", sel is not None and _only_name_label(sel))

    @classmethod
    def from_object(cls, obj: JsonObj) -> SidecarSet:
        """Read a SidecarSet object; raise ModelError when it cannot be used at all."""
        if not isinstance(obj, Mapping):
            raise ModelError(f"a SidecarSet must be an object, not {_type_name(obj)}")
        api_version = obj.get("apiVersion")
        if api_version is not None and api_version not in ACCEPTED_API_VERSIONS:
            raise ModelError(
                f"apiVersion: {api_version!r} is not a SidecarSet version ({' or '.join(ACCEPTED_API_VERSIONS)})"
            )
        kind = obj.get("kind")
        if kind is not None and kind != names.KIND:
            raise ModelError(f"kind: {kind!r} is not {names.KIND}")
        metadata = _object(obj.get("metadata"), "metadata", required=True)
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ModelError("metadata.name must be a non-empty string")
        spec = _object(obj.get("spec"), "spec", required=True)
        status = _object(obj.get("status"), "status", required=False)

        selector = _selector(spec.get("selector"), "spec.selector")
        namespace = spec.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise ModelError("spec.namespace must be a string")
        if namespace:
            ns_selector: JsonObj | None = {"matchLabels": {names.NS_NAME_LABEL: namespace}}
        else:
            ns_selector = _selector(spec.get("namespaceSelector"), "spec.namespaceSelector")

        init_containers = _sidecar_containers(spec.get("initContainers"), "spec.initContainers", init=True)
        containers = _sidecar_containers(spec.get("containers"), "spec.containers", init=False)
        seen: dict[str, str] = {}
        for field, group in (("spec.containers", containers), ("spec.initContainers", init_containers)):
            for i, sc in enumerate(group):
                where = f"{field}[{i}].name"
                if sc.name in seen:
                    raise ModelError(f"{where}: container name {sc.name!r} is already used by {seen[sc.name]}")
                seen[sc.name] = where

        injection = _object(spec.get("injectionStrategy"), "spec.injectionStrategy", required=False)
        paused = injection.get("paused", False)
        if not isinstance(paused, bool):
            raise ModelError("spec.injectionStrategy.paused must be a boolean")

        labels = metadata.get("labels") or {}
        generation = metadata.get("generation", 0)
        latest = status.get("latestRevision")
        return cls(
            name=name,
            obj=obj,
            spec=spec,
            resource_version=str(metadata.get("resourceVersion") or ""),
            generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
            creation_timestamp=str(metadata.get("creationTimestamp") or ""),
            labels=labels if isinstance(labels, Mapping) else {},
            selector=selector,
            namespace_selector=ns_selector,
            hash=hashing.spec_hash(spec),
            hash_without_image=hashing.spec_hash_without_image(spec),
            injection_paused=paused,
            containers=containers,
            init_containers=init_containers,
            volumes=_named_objects(spec.get("volumes"), "spec.volumes"),
            image_pull_secrets=_named_objects(spec.get("imagePullSecrets"), "spec.imagePullSecrets"),
            patch_pod_metadata=_patch_pod_metadata(spec.get("patchPodMetadata")),
            latest_revision=latest if isinstance(latest, str) and latest else None,
        )

    @property
    def container_names(self) -> tuple[str, ...]:
        """The sidecars a pod carries for this SidecarSet: containers and native-sidecar init containers."""
        return self._container_names

    @property
    def all_container_names(self) -> frozenset[str]:
        """Every name this SidecarSet puts into a pod, init containers included."""
        return self._all_container_names

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


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _object(value: Any, field: str, *, required: bool) -> JsonObj:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ModelError(f"{field} must be an object, not {_type_name(value)}")
    return value


def _selector(value: Any, field: str) -> JsonObj | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ModelError(f"{field} must be an object, not {_type_name(value)}")
    return value


def _only_name_label(selector: Mapping[str, Any]) -> bool:
    """Whether the selector constrains nothing but the namespace name label (so a name decides it)."""
    try:
        return _keys(selector) <= {names.NS_NAME_LABEL}
    except (AttributeError, TypeError):  # ill-formed: such a selector matches nothing anyway
        return False


def _keys(selector: Mapping[str, Any]) -> set[str]:
    keys = set((selector.get("matchLabels") or {}).keys())
    for expr in selector.get("matchExpressions") or []:
        if isinstance(expr, Mapping):
            keys.add(str(expr.get("key")))
    return keys


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ModelError(f"{field} must be a list, not {_type_name(value)}")
    return value


def _named_objects(value: Any, field: str) -> tuple[JsonObj, ...]:
    out: list[JsonObj] = []
    for i, item in enumerate(_list(value, field)):
        if not isinstance(item, dict):
            raise ModelError(f"{field}[{i}] must be an object, not {_type_name(item)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ModelError(f"{field}[{i}].name must be a non-empty string")
        out.append(item)
    return tuple(out)


def _enum(value: Any, field: str, allowed: tuple[_T, ...], default: _T) -> _T:
    if value is None or value == "":
        return default
    for candidate in allowed:
        if value == candidate:
            return candidate
    raise ModelError(f"{field}: unsupported value {value!r} (one of {', '.join(allowed)})")


def _share_policy(value: Any, field: str) -> bool:
    policy = _object(value, field, required=False)
    return _enum(policy.get("type"), f"{field}.type", _SHARE_POLICIES, "disabled") == "enabled"


def _sidecar_containers(value: Any, field: str, *, init: bool) -> tuple[SidecarContainer, ...]:
    out: list[SidecarContainer] = []
    default_policy = AFTER_APP if init else BEFORE_APP
    for i, raw in enumerate(_list(value, field)):
        where = f"{field}[{i}]"
        if not isinstance(raw, dict):
            raise ModelError(f"{where} must be an object, not {_type_name(raw)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ModelError(f"{where}.name must be a non-empty string")
        for key in ("env", "volumeMounts", "volumeDevices"):
            for j, item in enumerate(_list(raw.get(key), f"{where}.{key}")):
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    raise ModelError(f"{where}.{key}[{j}] must be an object with a string name")
        upgrade = _object(raw.get("upgradeStrategy"), f"{where}.upgradeStrategy", required=False)
        device_policy = raw.get("shareVolumeDevicePolicy")
        out.append(
            SidecarContainer(
                name=name,
                container={k: v for k, v in raw.items() if k not in _SIDECAR_ONLY_FIELDS},
                inject_policy=_enum(
                    raw.get("podInjectPolicy"), f"{where}.podInjectPolicy", _INJECT_POLICIES, default_policy
                ),
                upgrade_type=_enum(
                    upgrade.get("upgradeType"), f"{where}.upgradeStrategy.upgradeType", _UPGRADE_TYPES, "ColdUpgrade"
                ),
                share_volumes=_share_policy(raw.get("shareVolumePolicy"), f"{where}.shareVolumePolicy"),
                share_volume_devices=device_policy is not None
                and _share_policy(device_policy, f"{where}.shareVolumeDevicePolicy"),
                transfer_env=_transfer_env(raw.get("transferEnv"), f"{where}.transferEnv"),
                native=init and raw.get("restartPolicy") == "Always",
                has_resources_policy=raw.get("resourcesPolicy") is not None,
            )
        )
    return tuple(out)


def _transfer_env(value: Any, field: str) -> tuple[TransferEnv, ...]:
    out: list[TransferEnv] = []
    for i, raw in enumerate(_list(value, field)):
        where = f"{field}[{i}]"
        if not isinstance(raw, dict):
            raise ModelError(f"{where} must be an object, not {_type_name(raw)}")
        source = raw.get("sourceContainerName")
        if source is not None and not isinstance(source, str):
            raise ModelError(f"{where}.sourceContainerName must be a string")
        field_path: str | None = None
        source_from = _object(raw.get("sourceContainerNameFrom"), f"{where}.sourceContainerNameFrom", required=False)
        if source_from:
            ref = _object(source_from.get("fieldRef"), f"{where}.sourceContainerNameFrom.fieldRef", required=True)
            path = ref.get("fieldPath")
            if not isinstance(path, str) or not (path == "metadata.name" or _SUBSCRIPTED_PATH.match(path)):
                raise ModelError(
                    f"{where}.sourceContainerNameFrom.fieldRef.fieldPath: {path!r} is not supported "
                    "(metadata.name, metadata.labels['k'] or metadata.annotations['k'])"
                )
            field_path = path
        if not source and field_path is None:
            raise ModelError(f"{where}: sourceContainerName or sourceContainerNameFrom is required")
        env_names: list[str] = []
        env_name = raw.get("envName")
        if env_name is not None and not isinstance(env_name, str):
            raise ModelError(f"{where}.envName must be a string")
        if env_name:
            env_names.append(env_name)
        for j, item in enumerate(_list(raw.get("envNames"), f"{where}.envNames")):
            if not isinstance(item, str):
                raise ModelError(f"{where}.envNames[{j}] must be a string")
            if item not in env_names:
                env_names.append(item)
        out.append(TransferEnv(source or None, field_path, tuple(env_names)))
    return tuple(out)


def _patch_pod_metadata(value: Any) -> tuple[MetadataPatch, ...]:
    out: list[MetadataPatch] = []
    for i, raw in enumerate(_list(value, "spec.patchPodMetadata")):
        where = f"spec.patchPodMetadata[{i}]"
        if not isinstance(raw, dict):
            raise ModelError(f"{where} must be an object, not {_type_name(raw)}")
        annotations = _object(raw.get("annotations"), f"{where}.annotations", required=False)
        for key, val in annotations.items():
            if not isinstance(val, str):
                raise ModelError(f"{where}.annotations[{key}] must be a string")
        policy = _enum(raw.get("patchPolicy"), f"{where}.patchPolicy", _PATCH_POLICIES, "Retain")
        out.append(MetadataPatch(tuple(annotations.items()), policy))
    return tuple(out)
