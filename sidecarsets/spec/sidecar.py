"""A SidecarSet's containers, transferEnv, patchPodMetadata and the per-pod overrides it allows,
read once into typed values.

What the injection engine reads for every pod (the pod-ready container, mounted volume names,
the SidecarSet-only settings with their defaults, the bounds of `spec.overrides`) is derived here
once per SidecarSet change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as _derived  # `field` names a field path throughout this module
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.enums import InjectPolicy, PatchPolicy, SharePolicy, UpgradeType
from sidecarsets.spec.reading import Reader, type_name
from sidecarsets.spec.resourcespolicy import ResourcesPolicy, read_resources_policy
from sidecarsets.values import quantity
from sidecarsets.values.jsontemplate import JsonTemplate

# SidecarContainer fields that are not corev1.Container fields: they never reach the pod.
SIDECAR_ONLY_FIELDS = frozenset(
    {
        "podInjectPolicy",
        "upgradeStrategy",
        "shareVolumePolicy",
        "shareVolumeDevicePolicy",
        "transferEnv",
        "resourcesPolicy",
    }
)
SUBSCRIPTED_PATH = re.compile(r"^(metadata\.labels|metadata\.annotations)\['([^']*)'\]$")


def hot_pair(name: str) -> tuple[str, str]:
    """The two containers HotUpgrade sidecar `name` is in a pod: `<name>-1`, the one injected
    serving, and `<name>-2`, the one injected empty (Kruise's GetHotUpgradeContainerName). The one
    place these names are spelled, so that injection, rollout, status and validation agree."""
    return f"{name}-1", f"{name}-2"


@dataclass(frozen=True, slots=True)
class TransferEnv:
    """Env vars copied from an app container of the pod into the sidecar.

    The source is `source_container_name`, or read from the pod at `source_field_path`
    (`metadata.labels['k']` or `metadata.annotations['k']`: the only paths Kruise accepts).
    `env_names` are `envName` and `envNames` together, sorted and without repeats, as Kruise
    copies them.
    """

    source_container_name: str | None
    source_field_path: str | None
    env_names: tuple[str, ...]
    env_name_set: frozenset[str] = _derived(init=False, repr=False, compare=False)
    _subscript: tuple[str, str] | None = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_name_set", frozenset(self.env_names))
        m = None if self.source_field_path is None else SUBSCRIPTED_PATH.match(self.source_field_path)
        object.__setattr__(self, "_subscript", None if m is None else (m.group(1).split(".", 1)[1], m.group(2)))

    def source_in(self, pod_metadata: Mapping[str, Any]) -> str | None:
        """The source container name for this pod, or None when the pod does not say."""
        if self.source_field_path is None:
            return self.source_container_name
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
    (`fresh_container` gives a copy).
    """

    name: str
    container: JsonObj
    inject_policy: InjectPolicy
    upgrade_type: UpgradeType
    share_volumes: bool
    share_volume_devices: bool
    transfer_env: tuple[TransferEnv, ...]
    native: bool
    resources_policy: ResourcesPolicy | None
    init: bool = False  # listed in the SidecarSet's initContainers
    _volume_names: tuple[str, ...] = _derived(init=False, repr=False, compare=False)
    _template: JsonTemplate = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out: list[str] = []
        for key in ("volumeMounts", "volumeDevices"):
            items = self.container.get(key)
            for item in items if isinstance(items, list) else ():
                name = item.get("name") if isinstance(item, dict) else None
                if isinstance(name, str) and name not in out:
                    out.append(name)
        object.__setattr__(self, "_volume_names", tuple(out))
        object.__setattr__(self, "_template", JsonTemplate(self.container))

    @property
    def image(self) -> str | None:
        image = self.container.get("image")
        return image if isinstance(image, str) and image else None

    @property
    def hot(self) -> bool:
        return self.upgrade_type is UpgradeType.HOT

    @property
    def names_in_pod(self) -> tuple[str, ...]:
        """The container names this sidecar takes in a pod: its `hot_pair` when HotUpgrade splits
        it (a container, or a native-sidecar init container; a plain init container runs once and
        is injected whole), else its own name."""
        if self.hot and (self.native or not self.init):
            return hot_pair(self.name)
        return (self.name,)

    @property
    def has_resources_policy(self) -> bool:
        return self.resources_policy is not None

    def mounted_volume_names(self) -> tuple[str, ...]:
        """Names of the volumes this container uses through volumeMounts or volumeDevices."""
        return self._volume_names

    def fresh_container(self) -> JsonObj:
        """A deep copy of `container`, for a pod to own."""
        out: JsonObj = self._template.fresh()
        return out


def read_containers(reader: Reader, value: Any, field: str, *, init: bool) -> tuple[SidecarContainer, ...]:
    out: list[SidecarContainer] = []
    default_policy = InjectPolicy.AFTER_APP if init else InjectPolicy.BEFORE_APP
    for i, raw in enumerate(reader.list(value, field)):
        where = f"{field}[{i}]"
        if not isinstance(raw, dict):
            reader.fail(where, f"{where} must be an object, not {type_name(raw)}")
            continue
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            reader.fail(f"{where}.name", f"{where}.name must be a non-empty string")
            continue
        _check_named_lists(reader, raw, where)
        upgrade = reader.object(raw.get("upgradeStrategy"), f"{where}.upgradeStrategy")
        device_policy = raw.get("shareVolumeDevicePolicy")
        out.append(
            SidecarContainer(
                name=name,
                container={k: v for k, v in raw.items() if k not in SIDECAR_ONLY_FIELDS},
                inject_policy=reader.enum(
                    raw.get("podInjectPolicy"), f"{where}.podInjectPolicy", InjectPolicy, default_policy
                ),
                upgrade_type=reader.enum(
                    upgrade.get("upgradeType"), f"{where}.upgradeStrategy.upgradeType", UpgradeType, UpgradeType.COLD
                ),
                share_volumes=_share_policy(reader, raw.get("shareVolumePolicy"), f"{where}.shareVolumePolicy"),
                share_volume_devices=device_policy is not None
                and _share_policy(reader, device_policy, f"{where}.shareVolumeDevicePolicy"),
                transfer_env=_transfer_env(reader, raw.get("transferEnv"), f"{where}.transferEnv"),
                native=init and raw.get("restartPolicy") == "Always",
                resources_policy=read_resources_policy(reader, raw.get("resourcesPolicy"), f"{where}.resourcesPolicy"),
                init=init,
            )
        )
    return tuple(out)


def _check_named_lists(reader: Reader, raw: JsonObj, where: str) -> None:
    """env, volumeMounts and volumeDevices entries must be objects with string names."""
    for key in ("env", "volumeMounts", "volumeDevices"):
        for j, item in enumerate(reader.list(raw.get(key), f"{where}.{key}")):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                reader.fail(f"{where}.{key}[{j}]", f"{where}.{key}[{j}] must be an object with a string name")


def _share_policy(reader: Reader, value: Any, field: str) -> bool:
    policy = reader.object(value, field)
    return reader.enum(policy.get("type"), f"{field}.type", SharePolicy, SharePolicy.DISABLED) is SharePolicy.ENABLED


def _transfer_env(reader: Reader, value: Any, field: str) -> tuple[TransferEnv, ...]:
    out: list[TransferEnv] = []
    for i, raw in enumerate(reader.list(value, field)):
        where = f"{field}[{i}]"
        if not isinstance(raw, dict):
            reader.fail(where, f"{where} must be an object, not {type_name(raw)}")
            continue
        item = _transfer_env_item(reader, raw, where)
        if item is not None:
            out.append(item)
    return tuple(out)


def _transfer_env_item(reader: Reader, raw: JsonObj, where: str) -> TransferEnv | None:
    source = reader.string(raw.get("sourceContainerName"), f"{where}.sourceContainerName")
    field_path: str | None = None
    source_from = reader.object(raw.get("sourceContainerNameFrom"), f"{where}.sourceContainerNameFrom")
    if source_from:
        ref = reader.object(source_from.get("fieldRef"), f"{where}.sourceContainerNameFrom.fieldRef", required=True)
        path = ref.get("fieldPath")
        if not isinstance(path, str) or not SUBSCRIPTED_PATH.match(path):
            shown = repr(path) if isinstance(path, str) else type_name(path)
            reader.fail(
                f"{where}.sourceContainerNameFrom.fieldRef.fieldPath",
                f"{where}.sourceContainerNameFrom.fieldRef.fieldPath: {shown} is not supported "
                "(metadata.labels['k'] or metadata.annotations['k'])",
            )
            return None
        field_path = path
    if not source and field_path is None:
        reader.fail(where, f"{where}: sourceContainerName or sourceContainerNameFrom is required")
        return None
    env_names: set[str] = set()
    env_name = reader.string(raw.get("envName"), f"{where}.envName")
    if env_name:
        env_names.add(env_name)
    for j, item in enumerate(reader.list(raw.get("envNames"), f"{where}.envNames")):
        if not isinstance(item, str):
            reader.fail(f"{where}.envNames[{j}]", f"{where}.envNames[{j}] must be a string")
        elif item:
            env_names.add(item)
    # Kruise's sets.String.List(): byte-wise ascending, which is code point order for UTF-8.
    return TransferEnv(source or None, field_path, tuple(sorted(env_names)))


def read_patch_pod_metadata(reader: Reader, value: Any) -> tuple[MetadataPatch, ...]:
    out: list[MetadataPatch] = []
    for i, raw in enumerate(reader.list(value, "spec.patchPodMetadata")):
        where = f"spec.patchPodMetadata[{i}]"
        if not isinstance(raw, dict):
            reader.fail(where, f"{where} must be an object, not {type_name(raw)}")
            continue
        annotations = reader.object(raw.get("annotations"), f"{where}.annotations")
        bad = [key for key, val in annotations.items() if not isinstance(val, str)]
        for key in bad:
            reader.fail(f"{where}.annotations[{key}]", f"{where}.annotations[{key}] must be a string")
        policy = reader.enum(raw.get("patchPolicy"), f"{where}.patchPolicy", PatchPolicy, PatchPolicy.RETAIN)
        kept = tuple((k, v) for k, v in annotations.items() if isinstance(v, str))
        out.append(MetadataPatch(kept, policy))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# spec.overrides: what a pod may change of a sidecar by its annotation (sidecarsets.overrides)

OVERRIDABLE_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True, slots=True)
class ResourceRange:
    """The values a request and a limit of one resource may take (None: no bound on that side)."""

    resource: str
    min: quantity.Quantity | None
    max: quantity.Quantity | None

    def text(self) -> str:
        """The range as a message shows it: `50m to 2`, `at least 50m`, `at most 2`."""
        if self.min is not None and self.max is not None:
            return f"{self.min} to {self.max}"
        if self.min is not None:
            return f"at least {self.min}"
        return f"at most {self.max}" if self.max is not None else "any value"


@dataclass(frozen=True, slots=True)
class OverrideBounds:
    """One `spec.overrides[]` entry: what pods may override of sidecar `container`."""

    container: str
    resources: tuple[ResourceRange, ...] = ()
    env: tuple[str, ...] = ()  # env names a pod may set a value for, sorted

    def range_of(self, resource: str) -> ResourceRange | None:
        return next((r for r in self.resources if r.resource == resource), None)


def read_overrides(reader: Reader, value: Any) -> tuple[OverrideBounds, ...]:
    """`spec.overrides`, read for use. Every problem is advisory and drops what it touches (an entry,
    a resource's range, an env name): an owner's bound that cannot be read allows nothing, so a pod
    asking for it is refused rather than given an unchecked value. Validation refuses such specs."""
    out: list[OverrideBounds] = []
    for i, raw in enumerate(reader.list(value, "spec.overrides", advisory=True)):
        where = f"spec.overrides[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("containerName"), str):
            reader.fail(where, f"{where} must be an object with a string containerName", advisory=True)
            continue
        ranges: list[ResourceRange] = []
        resources = reader.object(raw.get("resources"), f"{where}.resources", advisory=True)
        for resource in OVERRIDABLE_RESOURCES:
            found = _range(reader, resource, resources.get(resource), f"{where}.resources.{resource}")
            if found is not None:
                ranges.append(found)
        env = reader.list(raw.get("env"), f"{where}.env", advisory=True)
        names = sorted({e for e in env if isinstance(e, str) and e})
        out.append(OverrideBounds(raw["containerName"], tuple(ranges), tuple(names)))
    return tuple(out)


def _range(reader: Reader, resource: str, value: Any, where: str) -> ResourceRange | None:
    section = reader.optional_object(value, where, advisory=True)
    if section is None:
        return None
    ends: list[quantity.Quantity | None] = []
    for end in ("min", "max"):
        raw = section.get(end)
        try:
            ends.append(None if raw is None else quantity.parse(quantity.json_text(raw)))
        except quantity.QuantityError as e:
            reader.fail(f"{where}.{end}", f"{where}.{end}: {e}", advisory=True)
            return None
    return ResourceRange(resource, ends[0], ends[1])
