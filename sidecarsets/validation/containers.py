"""Validation of the sidecar containers and init containers of a SidecarSet.

A bad sidecar does not fail when the SidecarSet is written but when it is injected: every pod
the selector matches would then be refused by the API server. Kruise guards against that by
running pod validation on a pod built from the sidecars; here each sidecar is checked as the
container it becomes (sidecarsets.validation.podrules, in the API server's words), and then its
SidecarSet-only fields (inject and share policies, upgrade strategy, transferEnv, resourcesPolicy).

Volume mounts must name a volume of the SidecarSet, as in Kruise: the pod's own volumes are not
known when the SidecarSet is written (a sidecar reaches them with `shareVolumePolicy`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from kuberuntime.jsontypes import resolve
from sidecarsets.spec.enums import InjectPolicy, SharePolicy, UpgradeType, values
from sidecarsets.spec.sidecar import hot_pair
from sidecarsets.validation.base import (
    Errors,
    FieldError,
    list_field,
    obj_field,
    objects,
    qualified_name_problem,
    required,
    str_field,
    type_name,
)
from sidecarsets.validation.podrules import validate_pod_container
from sidecarsets.validation.resources import validate_resources_policy

# Printable ASCII except '=' (Kubernetes relaxed env var names, GA since 1.34).
_ENV_NAME = re.compile(r"^[\x20-\x3c\x3e-\x7e]+$")
_SUBSCRIPTED = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")
# As Kruise (ConvertDownwardAPIFieldLabel): only a label or an annotation; not metadata.name.
ALLOWED_FIELD_PATHS = "metadata.labels['<KEY>'] or metadata.annotations['<KEY>']"


def env_name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "env var name must be a non-empty string"
    if not _ENV_NAME.match(name):
        return f"invalid env var name {name!r}: use printable ASCII characters other than '='"
    return None


def _field_ref(ref: Mapping[str, Any], path: str, errs: Errors) -> None:
    api_version = ref.get("apiVersion")
    if api_version in (None, ""):
        errs.append(FieldError(f"{path}.apiVersion", "apiVersion is required"))
    elif api_version != "v1":
        errs.append(FieldError(f"{path}.apiVersion", f"unsupported apiVersion {api_version!r}: only v1"))
    field_path = ref.get("fieldPath")
    if field_path in (None, ""):
        errs.append(FieldError(f"{path}.fieldPath", "fieldPath is required"))
        return
    if not isinstance(field_path, str):
        errs.append(FieldError(f"{path}.fieldPath", f"must be a string, not {type_name(field_path)}"))
        return
    m = _SUBSCRIPTED.match(field_path)
    if not m:
        errs.append(
            FieldError(f"{path}.fieldPath", f"fieldPath {field_path!r} is not supported: use {ALLOWED_FIELD_PATHS}")
        )
        return
    kind, key = m.groups()
    # Annotation keys are case-insensitive in the downward API; label keys are not.
    problem = qualified_name_problem(key.lower() if kind == "annotations" else key)
    if problem:
        errs.append(FieldError(f"{path}.fieldPath", problem))


def _transfer_env(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    tpath = f"{path}.transferEnv"
    for _, item_path, item in objects(list_field(container, "transferEnv", tpath, errs), tpath, errs):
        source = str_field(item, "sourceContainerName", f"{item_path}.sourceContainerName", errs)
        source_from = obj_field(item, "sourceContainerNameFrom", f"{item_path}.sourceContainerNameFrom", errs)
        if bool(source) == (item.get("sourceContainerNameFrom") is not None):
            errs.append(
                FieldError(item_path, "exactly one of sourceContainerName or sourceContainerNameFrom must be set")
            )
        if source_from is not None:
            ref_path = f"{item_path}.sourceContainerNameFrom.fieldRef"
            ref = obj_field(source_from, "fieldRef", ref_path, errs)
            if ref is not None:
                _field_ref(ref, ref_path, errs)
            elif source_from.get("fieldRef") is None:
                errs.append(FieldError(ref_path, "fieldRef is required in sourceContainerNameFrom"))
        env_name = item.get("envName")
        env_names = list_field(item, "envNames", f"{item_path}.envNames", errs)
        if env_name in (None, "") and not env_names:
            errs.append(FieldError(item_path, "one of envName or envNames must be set"))
        if env_name not in (None, ""):
            problem = env_name_problem(env_name)
            if problem:
                errs.append(FieldError(f"{item_path}.envName", problem))
        for i, name in enumerate(env_names):
            problem = env_name_problem(name)
            if problem:
                errs.append(FieldError(f"{item_path}.envNames[{i}]", problem))


def _enum(parent: Mapping[str, Any], key: str, allowed: list[str], path: str, what: str, errs: Errors) -> None:
    value = parent.get(key)
    if value not in allowed:
        errs.append(FieldError(path, f"unsupported {what} {value!r}: use {' or '.join(allowed)}"))


def _sidecar_fields(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    _enum(container, "podInjectPolicy", values(InjectPolicy), f"{path}.podInjectPolicy", "pod inject policy", errs)
    upgrade = obj_field(container, "upgradeStrategy", f"{path}.upgradeStrategy", errs)
    if upgrade is not None:
        upath = f"{path}.upgradeStrategy"
        _enum(upgrade, "upgradeType", values(UpgradeType), f"{upath}.upgradeType", "upgrade type", errs)
        str_field(upgrade, "hotUpgradeEmptyImage", f"{upath}.hotUpgradeEmptyImage", errs)
    for key in ("shareVolumePolicy", "shareVolumeDevicePolicy"):
        share = obj_field(container, key, f"{path}.{key}", errs)
        if share is not None:
            _enum(share, "type", values(SharePolicy), f"{path}.{key}.type", "share volume policy", errs)


def _container(
    container: Mapping[str, Any], path: str, errs: Errors, *, init: bool, volumes: Collection[str], seen: set[str]
) -> None:
    validate_pod_container(container, path, init=init, volumes=volumes, seen=seen, errs=errs)
    _sidecar_fields(container, path, errs)
    _transfer_env(container, path, errs)
    native = container.get("restartPolicy") == "Always"
    validate_resources_policy(container, path, errs, native_or_main=native or not init)


def validate_containers(spec: Mapping[str, Any], errs: Errors, *, volumes: Collection[str] = ()) -> None:
    """Both lists, with names unique across them (they end up in one pod); `volumes` are the names
    of the SidecarSet's valid volumes, which the sidecars' mounts must name."""
    lists = {key: list_field(spec, key, f"spec.{key}", errs) for key in ("containers", "initContainers")}
    if not lists["containers"] and not lists["initContainers"]:
        errs.append(required("spec", "no initContainer or container defined for SidecarSet"))
        return
    seen: set[str] = set()
    hot: list[tuple[str, str]] = []  # (path, name) of the HotUpgrade sidecars
    for key, items in lists.items():
        for _, path, container in objects(items, f"spec.{key}", errs):
            _container(container, path, errs, init=key == "initContainers", volumes=volumes, seen=seen)
            if _is_hot(container, init=key == "initContainers") and isinstance(container.get("name"), str):
                hot.append((path, container["name"]))
    for path, name in hot:
        first, second = pair = hot_pair(name)
        for taken in pair:
            if taken in seen:
                errs.append(
                    FieldError(
                        f"{path}.name",
                        f"HotUpgrade container {name} is injected as {first} and {second}, "
                        f"and this SidecarSet has another container named {taken}",
                    )
                )


def _is_hot(container: Mapping[str, Any], *, init: bool) -> bool:
    """Injected as a -1/-2 pair: HotUpgrade on a container or on a native-sidecar init container."""
    if resolve(container, "upgradeStrategy", "upgradeType") != UpgradeType.HOT.value:
        return False
    return not init or container.get("restartPolicy") == "Always"
